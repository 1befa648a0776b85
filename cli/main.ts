#!/usr/bin/env node
// The command-line tool: `keys create` prints a new API key once (it is stored hashed); `gates run`
// runs a workspace's gates as the service does; `gates verify` checks an evidence pack offline.
import { parseArgs } from 'node:util';
import { ConfigError, loadConfig, TENANT_ID_PATTERN } from '../config/env.js';
import { apiKeysOf } from '../engine/auth/index.js';
import { systemClock, createLogger } from '../engine/platform/index.js';
import { openStore } from '../engine/store/index.js';
import { gatesRun, gatesVerify, UsageError } from './gates.js';

const USAGE = `usage: automation-service <command>

  keys create --tenant <tenant> [--label <text>]
                make an API key for a tenant; the key is printed once and stored hashed
  gates run [--workspace DIR] [--only ID]... [--json] [--record --tenant <tenant>]
                run the workspace's gates (gates.yaml, or those detected), each in the sandbox;
                exits 1 when a required gate does not pass; --record seals the results into the
                service's ledger (its store and SERVICE_EVIDENCE_KEY, from the environment)
  gates verify <pack.tar | pack.json> --key KEY_ID [--json]
                check an evidence pack offline: signature, hash chain, payload digests; exits 1
                and names the first bad entry when anything does not hold, 3 when it holds but
                no --key pinned the service's key (the evidence-pack answer's public_key.key_id)
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
  const write = (text: string) => void process.stdout.write(text);
  if (group === 'gates' && verb === 'run') process.exitCode = await gatesRun(rest, write);
  else if (group === 'gates' && verb === 'verify') process.exitCode = await gatesVerify(rest, write);
  else if (group === 'gates') fail(`unknown command: gates ${verb ?? ''}\n\n${USAGE}`);
  if (group === 'gates') return;
  if (!group || group === '--help' || group === 'help') {
    process.stdout.write(USAGE);
    return;
  }
  fail(`unknown command: ${[group, verb].filter(Boolean).join(' ')}\n\n${USAGE}`);
}

try {
  await main(process.argv.slice(2));
} catch (err) {
  if (err instanceof ConfigError || err instanceof UsageError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) fail((err as Error).message);
  if ((err as { code?: string }).code === 'gate-set-invalid') fail((err as Error).message);
  throw err;
}
