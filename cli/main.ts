#!/usr/bin/env node
// The command-line tool. `keys create --tenant T` prints a new API key once; it is stored hashed.
import { parseArgs } from 'node:util';
import { ConfigError, loadConfig, TENANT_ID_PATTERN } from '../config/env.js';
import { apiKeysOf } from '../engine/auth/index.js';
import { systemClock, createLogger } from '../engine/platform/index.js';
import { openStore } from '../engine/store/index.js';

const USAGE = `usage: automation-service keys create --tenant <tenant> [--label <text>]

  keys create   make an API key for a tenant; the key is printed once and stored hashed
`;

function fail(message: string): never {
  process.stderr.write(`${message}\n`);
  process.exit(2);
}

async function keysCreate(args: string[]): Promise<void> {
  const { values } = parseArgs({ args, options: { tenant: { type: 'string' }, label: { type: 'string' } }, strict: true });
  if (!values.tenant || !TENANT_ID_PATTERN.test(values.tenant)) fail(`--tenant is required: letters, digits, _ or -, at most 64\n\n${USAGE}`);
  const config = loadConfig();
  const store = await openStore({ mongodbUri: config.mongodbUri, dataDir: config.dataDir });
  try {
    const keys = apiKeysOf({ store, clock: systemClock, log: createLogger('warn') });
    const { record, key } = await keys.create(values.tenant, { label: values.label, source: 'cli' });
    process.stderr.write(`Created key ${record.id} for tenant ${record.tenant_id} (${store.kind} store). It is shown once:\n`);
    process.stdout.write(`${key}\n`);
  } finally {
    await store.close();
  }
}

async function main(argv: string[]): Promise<void> {
  const [group, verb, ...rest] = argv;
  if (group === 'keys' && verb === 'create') return keysCreate(rest);
  if (!group || group === '--help' || group === 'help') {
    process.stdout.write(USAGE);
    return;
  }
  fail(`unknown command: ${[group, verb].filter(Boolean).join(' ')}\n\n${USAGE}`);
}

try {
  await main(process.argv.slice(2));
} catch (err) {
  if (err instanceof ConfigError || (err as { code?: string }).code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') fail((err as Error).message);
  throw err;
}
