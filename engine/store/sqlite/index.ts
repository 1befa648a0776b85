// SQLite adapter (better-sqlite3, WAL): the embedded default. Documents are JSON columns; the
// columns the API filters on are indexed beside them. Writes that depend on a read run in
// IMMEDIATE transactions, so they are conditional even with several processes on one file.
// One file per repository.
import type { Store } from '../port.js';
import { apiKeyRepo } from './api-keys.js';
import { automationRepo } from './automations.js';
import { connectionRepo } from './connections.js';
import { notificationDeliveryRepo, notificationEndpointRepo } from './notifications.js';
import { groupCommit, openDatabase, startCheckpointer, type Db } from './db.js';
import { deliveryRepo } from './deliveries.js';
import { evidenceRepo } from './evidence.js';
import { gateRunRepo } from './gate-runs.js';
import { idempotencyKeyRepo } from './idempotency-keys.js';
import { runRepo } from './runs.js';
import { agentRepo, messageRepo, sessionRepo } from './sessions.js';
import { taskRepo } from './tasks.js';
import { webhookSecretRepo } from './webhook-secrets.js';

function deploymentRepo(db: Db): Store['deployment'] {
  const claim = db.prepare("INSERT OR IGNORE INTO deployment (name, value) VALUES ('queue_prefix', ?)");
  const read = db.prepare<[], { value: string }>("SELECT value FROM deployment WHERE name = 'queue_prefix'");
  const move = db.prepare("INSERT OR REPLACE INTO deployment (name, value) VALUES ('queue_prefix', ?)");
  return {
    async claimQueuePrefix(prefix) {
      claim.run(prefix);
      return read.get()!.value;
    },
    async moveQueuePrefix(prefix) {
      move.run(prefix);
    },
  };
}

/** How long a write the file refused keeps the store not ready (GET /readyz), whatever writes pass since. */
const STORAGE_FAILURE_MS = 10_000;

export function openSqliteStore(file: string, onCheckpointerFailure: (err: Error) => void = () => {}): Store {
  const db = openDatabase(file);
  const checkpointer = startCheckpointer(db, onCheckpointerFailure);
  const commit = groupCommit(db);
  const probe = db.prepare('INSERT INTO readiness (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at');
  return {
    kind: 'sqlite',
    deployment: deploymentRepo(db),
    automations: automationRepo(db),
    apiKeys: apiKeyRepo(db),
    runs: runRepo(db),
    idempotencyKeys: idempotencyKeyRepo(db),
    webhookSecrets: webhookSecretRepo(db),
    connections: connectionRepo(db),
    notificationEndpoints: notificationEndpointRepo(db),
    notificationDeliveries: notificationDeliveryRepo(db),
    deliveries: deliveryRepo(db),
    sessions: sessionRepo(db),
    agents: agentRepo(db),
    messages: messageRepo(db),
    tasks: taskRepo(db),
    evidence: evidenceRepo(db),
    gateRuns: gateRunRepo(db),
    async ping() {
      // a write, in the group commit as every write is: a file that takes none is not ready, nor one that refused
      // another write of late (a full disk may still take this small one in the log's reused room)
      const failed = commit.lastStorageFailure();
      if (failed && Date.now() - failed.at < STORAGE_FAILURE_MS)
        throw Object.assign(new Error(`the store refused a write ${Math.round((Date.now() - failed.at) / 1000)} s ago (${failed.code})`), {
          code: failed.code,
        });
      await commit(() => probe.run(new Date().toISOString()));
    },
    async close() {
      await commit.drain(); // the writes asked for before the close are committed, not dropped
      await checkpointer?.stop();
      if (db.open) db.close();
    },
  };
}
