// shell: a command in the run's workspace, in the sandbox (sandbox.ts). Its own process group, so an
// abort kills the command and everything it started; an environment of a short allowlist, never the
// service's secrets.
import { TailBuffer, stringArg, ToolError, type Tool } from './tool.js';

export const OUTPUT_MAX_BYTES = 64 * 1024;
const KILL_GRACE_MS = 500;

function killGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // the group is gone already
  }
}

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
    const extra = (args.env && typeof args.env === 'object' ? args.env : {}) as Record<string, unknown>;
    const env = { ...ctx.childEnv, ...Object.fromEntries(Object.entries(extra).map(([k, v]) => [k, String(v)])) };
    if (ctx.signal.aborted) throw new ToolError('aborted', 'the run was stopped before the command started');
    const proc = ctx.sandbox.spawn(['/bin/sh', '-c', command], { workspace: ctx.workspace, env, network: ctx.network, binds: ctx.binds });
    const { child } = proc;
    const stdout = new TailBuffer(OUTPUT_MAX_BYTES);
    const stderr = new TailBuffer(OUTPUT_MAX_BYTES);
    child.stdout!.on('data', (d: Buffer) => {
      stdout.push(d);
      ctx.output('stdout', d.toString('utf8'));
    });
    child.stderr!.on('data', (d: Buffer) => {
      stderr.push(d);
      ctx.output('stderr', d.toString('utf8'));
    });
    let killTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      if (child.pid === undefined) return;
      killGroup(child.pid, 'SIGTERM');
      killTimer = setTimeout(() => killGroup(child.pid!, 'SIGKILL'), KILL_GRACE_MS);
    };
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    try {
      const { code, signal } = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
        child.once('error', reject);
        child.once('close', (c: number | null, s: NodeJS.Signals | null) => resolve({ code: c, signal: s }));
      });
      // the command may have left children behind in its group: they go with it
      if (child.pid !== undefined) killGroup(child.pid, 'SIGKILL');
      const output = { exit_code: code, signal, stdout: stdout.text(), stderr: stderr.text(), truncated: stdout.truncated || stderr.truncated };
      if (ctx.signal.aborted) return { output, error: { code: 'aborted', message: 'the command was stopped' } };
      if (code !== 0) return { output, error: { code: 'nonzero-exit', message: `the command exited with ${code ?? signal}` } };
      return { output };
    } finally {
      ctx.signal.removeEventListener('abort', onAbort);
      clearTimeout(killTimer);
      proc.done();
    }
  },
};
