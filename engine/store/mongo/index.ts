// MongoDB adapter (mongoose): used when MONGODB_URI is set. Same contract as the SQLite adapter;
// conditional updates are single findOneAndUpdate calls with the expected status in the filter.
// One file per repository, each with its schema and indexes.
import mongoose, { type Connection } from 'mongoose';
import type {
  AgentRecord,
  ApiKeyRecord,
  Automation,
  NotificationDelivery,
  NotificationEndpoint,
  ConnectionRecord,
  MessageRecord,
  Run,
  Session,
  WebhookDelivery,
  WebhookSecretRecord,
} from '../../platform/index.js';
import type { Store } from '../port.js';
import { apiKeyRepo, apiKeySchema } from './api-keys.js';
import { automationRepo, automationSchema } from './automations.js';
import { connectionRepo, connectionSchema } from './connections.js';
import { notificationDeliveryRepo, notificationDeliverySchema, notificationEndpointRepo, notificationEndpointSchema } from './notifications.js';
import { deliveryRepo, deliverySchema } from './deliveries.js';
import { evidenceRepo, ledgerPayloadSchema, ledgerSchema } from './evidence.js';
import { gateResultSchema, gateRunRepo, gateRunSchema } from './gate-runs.js';
import { idempotencyKeyRepo, idempotencyKeySchema } from './idempotency-keys.js';
import { leaseSchema, leasesOf, type StoredLease } from './leases.js';
import type { Stored } from './documents.js';
import { runRepo, runSchema, runStepSchema, runTurnSchema } from './runs.js';
import { agentRepo, agentSchema, messageRepo, messageSchema, sessionRepo, sessionSchema, type SessionRows } from './sessions.js';
import { taskRepo, taskSchema } from './tasks.js';
import { webhookSecretRepo, webhookSecretSchema } from './webhook-secrets.js';

export async function openMongoStore(uri: string): Promise<Store> {
  const conn = await mongoose.createConnection(uri, { serverSelectionTimeoutMS: 5000 }).asPromise();
  const automations = conn.model<Stored<Automation>>('Automation', automationSchema, 'automations');
  const apiKeys = conn.model<Stored<ApiKeyRecord>>('ApiKey', apiKeySchema, 'api_keys');
  const runs = conn.model<Stored<Run>>('Run', runSchema, 'runs');
  const runSteps = conn.model('RunStep', runStepSchema, 'run_steps');
  const runTurns = conn.model('RunTurn', runTurnSchema, 'run_turns');
  const idempotencyKeys = conn.model('IdempotencyKey', idempotencyKeySchema, 'idempotency_keys');
  const webhookSecrets = conn.model<WebhookSecretRecord & { _id: string }>('WebhookSecret', webhookSecretSchema, 'webhook_secrets');
  const connections = conn.model<Stored<ConnectionRecord>>('Connection', connectionSchema, 'connections');
  const notificationEndpoints = conn.model<Stored<NotificationEndpoint>>('NotificationEndpoint', notificationEndpointSchema, 'notification_endpoints');
  const notificationDeliveries = conn.model<Stored<NotificationDelivery>>('NotificationDelivery', notificationDeliverySchema, 'notification_deliveries');
  const deliveries = conn.model<Stored<WebhookDelivery>>('Delivery', deliverySchema, 'deliveries');
  const sessions = conn.model<Stored<Session>>('Session', sessionSchema, 'sessions');
  const agents = conn.model<Stored<AgentRecord>>('Agent', agentSchema, 'agents');
  const messages = conn.model<Stored<MessageRecord>>('Message', messageSchema, 'messages');
  const tasks = conn.model('Task', taskSchema, 'tasks');
  const ledger = conn.model('Ledger', ledgerSchema, 'ledger');
  const ledgerPayloads = conn.model('LedgerPayload', ledgerPayloadSchema, 'ledger_payloads');
  const gateRuns = conn.model('GateRun', gateRunSchema, 'gate_runs');
  const gateResults = conn.model('GateResult', gateResultSchema, 'gate_results');
  const storeLeases = conn.model<StoredLease>('StoreLease', leaseSchema, 'store_leases');
  // the deployment a store belongs to (its queue prefix), one document a name
  const deployment = conn.collection<{ _id: string; value: string }>('deployment');
  const models = [
    automations,
    apiKeys,
    runs,
    runSteps,
    runTurns,
    idempotencyKeys,
    webhookSecrets,
    connections,
    notificationEndpoints,
    notificationDeliveries,
    deliveries,
    sessions,
    agents,
    messages,
    tasks,
    ledger,
    ledgerPayloads,
    gateRuns,
    gateResults,
    storeLeases,
  ];
  await Promise.all(models.map((m) => m.init()));
  const leases = leasesOf(storeLeases);
  const keys = idempotencyKeyRepo(idempotencyKeys as never, runs as never);
  // the same records, for creates' keys: a claim looks for the automation its record made
  const automationKeys = idempotencyKeyRepo(idempotencyKeys as never, automations as never);
  return {
    kind: 'mongo',
    deployment: {
      async claimQueuePrefix(prefix) {
        await deployment.updateOne({ _id: 'queue_prefix' }, { $setOnInsert: { value: prefix } }, { upsert: true });
        return (await deployment.findOne({ _id: 'queue_prefix' }))!.value;
      },
      async moveQueuePrefix(prefix) {
        await deployment.updateOne({ _id: 'queue_prefix' }, { $set: { value: prefix } }, { upsert: true });
      },
    },
    automations: automationRepo(automations, leases, automationKeys),
    apiKeys: apiKeyRepo(apiKeys, leases),
    runs: runRepo(runs, runSteps as never, runTurns as never, keys, sessions),
    idempotencyKeys: keys,
    webhookSecrets: webhookSecretRepo(webhookSecrets),
    connections: connectionRepo(connections, leases),
    notificationEndpoints: notificationEndpointRepo(notificationEndpoints, leases, notificationDeliveries),
    notificationDeliveries: notificationDeliveryRepo(notificationDeliveries),
    deliveries: deliveryRepo(deliveries),
    sessions: sessionRepo(sessions, { runs, runSteps, runTurns, agents, messages, tasks, leases: storeLeases } as unknown as SessionRows),
    agents: agentRepo(agents, sessions, leases),
    messages: messageRepo(messages, sessions),
    tasks: taskRepo(tasks as never, leases, sessions as never),
    evidence: evidenceRepo(ledger as never, ledgerPayloads as never),
    gateRuns: gateRunRepo(gateRuns as never, gateResults as never),
    async ping() {
      await pingConnection(conn);
      // a write too: a server that takes none (a secondary after a failover, a full disk, a lost quorum) is not ready
      await conn.db!.collection('readiness').updateOne({ _id: 'probe' as never }, { $set: { at: new Date() } }, { upsert: true });
    },
    async close() {
      await conn.close();
    },
  };
}

async function pingConnection(conn: Connection): Promise<void> {
  if (!conn.db) throw new Error('MongoDB connection is not open');
  await conn.db.admin().ping();
}
