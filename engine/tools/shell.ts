// shell: a command in the run's workspace, in the sandbox (sandbox.ts). Its own process group, so an
// abort kills the command and everything it started; an environment of a short allowlist, never the
// service's secrets.
import { runProcess } from './process.js';
import { envArg, stringArg, textOf, ToolError, type Tool } from './tool.js';

export const OUTPUT_MAX_BYTES = 64 * 1024;

export const shellTool: Tool = {
  name: 'shell',
  description: 'Run a shell command (/bin/sh -c) in the workspace. Returns exit code, stdout and stderr (last 64 KB of each).',
  parameters: {
    type: 'object',
    required: ['command'],
    properties: {
      command: { type: 'string', description: 'The command line.' },
      env: { type: 'object', additionalProperties: { type: 'string' }, description: 'Extra environment variables.' },
    },
  },
  async execute(args, ctx) {
    const command = stringArg(args, 'command');
    const extra = envArg(args);
    // a value that is not text (a reference to a number or an object) is its JSON, as in a command's text
    const env = { ...ctx.childEnv, ...Object.fromEntries(Object.entries(extra).map(([k, v]) => [k, textOf(v)])) };
    if (ctx.signal.aborted) throw new ToolError('aborted', 'the run was stopped before the command started');
    const r = await runProcess(ctx.sandbox, ['/bin/sh', '-c', command], {
      workspace: ctx.workspace,
      env,
      network: ctx.network,
      readOnlyBinds: ctx.readOnlyBinds,
      signal: ctx.signal,
      maxBytes: OUTPUT_MAX_BYTES,
      onOutput: ctx.output,
    });
    const output = { exit_code: r.exit_code, signal: r.signal, stdout: r.stdout, stderr: r.stderr, truncated: r.truncated };
    if (r.aborted) return { output, error: { code: 'aborted', message: 'the command was stopped' } };
    if (r.out_of_memory && r.exit_code !== 0)
      return {
        output,
        error: {
          code: 'memory-exceeded',
          message: `the command's processes together used more than the step's ${ctx.sandbox.limits?.memoryMb} MB of memory (SERVICE_SANDBOX_MEMORY_MB); the kernel ended one`,
        },
      };
    if (r.cpu_exceeded)
      return {
        output,
        error: {
          code: 'cpu-exceeded',
          message: `a process of the command used the ${ctx.sandbox.limits?.cpuSeconds} s of CPU time a process of a step may (SERVICE_SANDBOX_CPU_SECONDS); the kernel ended it (exit ${r.exit_code ?? r.signal})`,
        },
      };
    if (r.exit_code !== 0) return { output, error: { code: 'nonzero-exit', message: `the command exited with ${r.exit_code ?? r.signal}` } };
    return { output };
  },
};
