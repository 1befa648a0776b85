// The sandbox the audit's integration tests run phases in: the audit's own limits, a prefix of the test's.
import { createLogger } from '../../engine/platform/index.js';
import { openSandbox, type Sandbox } from '../../engine/tools/index.js';

export function openAuditSandbox(name: string): Sandbox {
  return openSandbox({
    mode: 'auto',
    limits: { cpuSeconds: 120, memoryMb: 4096, processes: 256, fileSizeMb: 100 },
    prefix: `${name}-${process.pid}`,
    pathVar: process.env.PATH,
    log: createLogger('silent'),
  });
}
