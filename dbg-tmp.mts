import { openSandbox, runProcess } from './engine/tools/index.ts';
import { createLogger } from './engine/platform/index.ts';
const sb = openSandbox({
  mode: 'bwrap',
  limits: { cpuSeconds: 600, memoryMb: 4096, processes: 256, fileSizeMb: 1024 },
  prefix: 'dbg',
  pathVar: process.env.PATH,
  log: createLogger('error'),
});
const r = await runProcess(
  sb,
  [
    process.execPath,
    '--disable-wasm-trap-handler',
    '--import',
    'file:///work/main/node_modules/tsx/dist/loader.mjs',
    '/work/main/engine/audit/phases/phase-main.ts',
    process.argv[2] ?? 'architecture',
    '{}',
  ],
  {
    workspace: '/work/main',
    readOnly: true,
    readOnlyBinds: ['/work/main/engine', '/work/main/node_modules', '/work/main/package.json', '/work/main/tsconfig.json'],
    env: { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', TSX_TSCONFIG_PATH: '/work/main/tsconfig.json' },
    network: false,
    maxBytes: 1e6,
    timeoutMs: 60000,
  },
);
console.log(r.exit_code, r.duration_ms, r.stderr.slice(-1500), r.stdout.slice(0, 200));
sb.close();
