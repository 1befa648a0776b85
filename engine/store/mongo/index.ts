// MongoDB adapter (mongoose): used when MONGODB_URI is set. Same contract as the SQLite adapter;
// conditional updates are single findOneAndUpdate calls with the expected status in the filter.
import mongoose, { Schema, type Connection, type Model } from 'mongoose';
import type { ApiKeyRecord, Automation, Run, WebhookDelivery, WebhookSecretRecord } from '../../model.js';
import {
  decodeCursor,
  toPage,
  type ApiKeyRepo,
  type AutomationRepo,
  type DeliveryRepo,
  type RunRepo,
  type RunStats,
  type Store,
  type WebhookSecretRepo,
} from '../port.js';

type Stored<T extends { id: string }> = Omit<T, 'id'> & { _id: string };

function toStored<T extends { id: string }>(doc: T): Stored<T> {
  const { id, ...rest } = doc;
  return { _id: id, ...rest } as Stored<T>;
}

function fromStored<T extends { id: string }>(doc: Stored<T> | null): T | null {
  if (!doc) return null;
  const { _id, ...rest } = doc as Stored<T> & { __v?: number };
  delete (rest as { __v?: number }).__v;
  return { id: _id, ...rest } as unknown as T;
}

const loose = { strict: false, versionKey: false, minimize: false } as const;

const automationSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, status: { type: String, required: true } }, loose);
automationSchema.index({ tenant_id: 1, _id: -1 });
automationSchema.index({ tenant_id: 1, status: 1, _id: -1 });

const runSchema = new Schema(
  {
    _id: String,
    tenant_id: { type: String, required: true },
    kind: String,
    status: String,
    automation_id: String,
    session_id: String,
    created_at: String,
    finished_at: String,
  },
  loose,
);
runSchema.index({ tenant_id: 1, automation_id: 1, _id: -1 });
runSchema.index({ tenant_id: 1, session_id: 1, _id: -1 });
runSchema.index({ tenant_id: 1, kind: 1, finished_at: -1 });
runSchema.index({ status: 1, created_at: 1 });

const apiKeySchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, hash: { type: String, required: true } }, loose);
apiKeySchema.index({ hash: 1 }, { unique: true });
apiKeySchema.index({ tenant_id: 1, _id: 1 });

const webhookSecretSchema = new Schema({ _id: String, tenant_id: { type: String, required: true }, kind: { type: String, required: true } }, loose);
webhookSecretSchema.index({ tenant_id: 1, kind: 1 }, { unique: true });

const deliverySchema = new Schema(
  { _id: String, tenant_id: { type: String, required: true }, kind: String, status: String, provider_delivery_id: String, received_at: String },
  loose,
);
deliverySchema.index({ tenant_id: 1, _id: -1 });
deliverySchema.index({ tenant_id: 1, kind: 1, _id: -1 });
// status first: a tenant's status filter and the reconciler's scan of received deliveries share it
deliverySchema.index({ status: 1, tenant_id: 1, _id: -1 });
deliverySchema.index(
  { tenant_id: 1, kind: 1, provider_delivery_id: 1 },
  { unique: true, partialFilterExpression: { provider_delivery_id: { $type: 'string' } } },
);

export async function openMongoStore(uri: string): Promise<Store> {
  const conn = await mongoose.createConnection(uri, { serverSelectionTimeoutMS: 5000 }).asPromise();
  const automations = conn.model<Stored<Automation>>('Automation', automationSchema, 'automations');
  const apiKeys = conn.model<Stored<ApiKeyRecord>>('ApiKey', apiKeySchema, 'api_keys');
  const runs = conn.model<Stored<Run>>('Run', runSchema, 'runs');
  const webhookSecrets = conn.model<WebhookSecretRecord & { _id: string }>('WebhookSecret', webhookSecretSchema, 'webhook_secrets');
  const deliveries = conn.model<Stored<WebhookDelivery>>('Delivery', deliverySchema, 'deliveries');
  await Promise.all([automations.init(), apiKeys.init(), runs.init(), webhookSecrets.init(), deliveries.init()]);
  return {
    kind: 'mongo',
    automations: automationRepo(automations),
    apiKeys: apiKeyRepo(apiKeys),
    runs: runRepo(runs),
    webhookSecrets: webhookSecretRepo(webhookSecrets),
    deliveries: deliveryRepo(deliveries),
    async ping() {
      await pingConnection(conn);
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

function definedOnly<T extends object>(changes: T): Partial<T> {
  return Object.fromEntries(Object.entries(changes).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function automationRepo(model: Model<Stored<Automation>>): AutomationRepo {
  return {
    async insert(a) {
      await model.collection.insertOne(toStored(a) as never);
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Automation>>());
    },
    async list(tenantId, q) {
      const after = decodeCursor(q.cursor);
      const filter: Record<string, unknown> = { tenant_id: tenantId, status: q.statuses ? { $in: q.statuses } : { $ne: 'archived' } };
      if (after) filter._id = { $lt: after };
      const rows = await model
        .find(filter)
        .sort({ _id: -1 })
        .limit(q.limit + 1)
        .lean<Stored<Automation>[]>();
      return toPage(
        rows.map((r) => fromStored(r)!),
        q.limit,
      );
    },
    async update(tenantId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<Stored<Automation>>();
      return fromStored(updated);
    },
    async listEnabledWithTrigger(type, tenantId) {
      const filter: Record<string, unknown> = { status: 'enabled', 'triggers.type': type, ...(tenantId === undefined ? {} : { tenant_id: tenantId }) };
      const rows = await model.find(filter).sort({ _id: 1 }).lean<Stored<Automation>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}

function runRepo(model: Model<Stored<Run>>): RunRepo {
  const page = async (filter: Record<string, unknown>, q: { limit: number; cursor?: string }) => {
    const after = decodeCursor(q.cursor);
    if (after) filter._id = { $lt: after };
    const rows = await model
      .find(filter)
      .sort({ _id: -1 })
      .limit(q.limit + 1)
      .lean<Stored<Run>[]>();
    return toPage(
      rows.map((r) => fromStored(r)!),
      q.limit,
    );
  };
  return {
    async insert(r) {
      await model.collection.insertOne(toStored(r) as never);
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<Run>>());
    },
    async update(tenantId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<Stored<Run>>();
      return fromStored(updated);
    },
    listByAutomation: (tenantId, automationId, q) => page({ tenant_id: tenantId, automation_id: automationId }, q),
    listBySession: (tenantId, sessionId, q) => page({ tenant_id: tenantId, session_id: sessionId }, q),
    async automationStats(tenantId, automationId, recent): Promise<RunStats> {
      const grouped = await model.aggregate<{ _id: Run['status']; n: number }>([
        { $match: { tenant_id: tenantId, automation_id: automationId } },
        { $group: { _id: '$status', n: { $sum: 1 } } },
      ]);
      const durations = await model
        .find({ tenant_id: tenantId, automation_id: automationId, duration_ms: { $ne: null } }, { duration_ms: 1 })
        .sort({ _id: -1 })
        .limit(recent)
        .lean<{ duration_ms: number }[]>();
      const last = await model.findOne({ tenant_id: tenantId, automation_id: automationId }).sort({ _id: -1 }).lean<Stored<Run>>();
      return { counts: Object.fromEntries(grouped.map((g) => [g._id, g.n])), durations_ms: durations.map((d) => d.duration_ms), last: fromStored(last) };
    },
    async recentDurations(tenantId, kind, limit) {
      const rows = await model
        .find({ tenant_id: tenantId, kind, finished_at: { $ne: null }, duration_ms: { $ne: null } }, { duration_ms: 1 })
        .sort({ finished_at: -1 })
        .limit(limit)
        .lean<{ duration_ms: number }[]>();
      return rows.map((r) => r.duration_ms);
    },
    async countByKindAndStatus() {
      const rows = await model.aggregate<{ _id: { kind: Run['kind']; status: Run['status'] }; count: number }>([
        { $group: { _id: { kind: '$kind', status: '$status' }, count: { $sum: 1 } } },
      ]);
      return rows.map((r) => ({ kind: r._id.kind, status: r._id.status, count: r.count }));
    },
    async listStale(status, createdBefore, limit) {
      const rows = await model
        .find({ status, created_at: { $lt: createdBefore } })
        .sort({ created_at: 1 })
        .limit(limit)
        .lean<Stored<Run>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}

function apiKeyRepo(model: Model<Stored<ApiKeyRecord>>): ApiKeyRepo {
  return {
    async insert(k) {
      try {
        await model.collection.insertOne(toStored(k) as never);
        return true;
      } catch (err) {
        if ((err as { code?: number }).code === 11000) return false;
        throw err;
      }
    },
    async findByHash(hash) {
      return fromStored(await model.findOne({ hash }).lean<Stored<ApiKeyRecord>>());
    },
    async list(tenantId) {
      const rows = await model.find({ tenant_id: tenantId }).sort({ _id: 1 }).lean<Stored<ApiKeyRecord>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}

function webhookSecretRepo(model: Model<WebhookSecretRecord & { _id: string }>): WebhookSecretRepo {
  const strip = ({ _id, ...rest }: WebhookSecretRecord & { _id: string }) => rest as WebhookSecretRecord;
  return {
    async put(r) {
      await model.collection.replaceOne({ _id: `${r.tenant_id}:${r.kind}` } as never, { ...r }, { upsert: true });
    },
    async list(tenantId) {
      const rows = await model.find({ tenant_id: tenantId }).sort({ kind: 1 }).lean<(WebhookSecretRecord & { _id: string })[]>();
      return rows.map(strip);
    },
    async delete(tenantId, kind) {
      return (await model.deleteOne({ _id: `${tenantId}:${kind}` })).deletedCount === 1;
    },
  };
}

function deliveryRepo(model: Model<Stored<WebhookDelivery>>): DeliveryRepo {
  return {
    async insert(d) {
      try {
        await model.collection.insertOne(toStored(d) as never);
        return null;
      } catch (err) {
        if ((err as { code?: number }).code !== 11000 || d.provider_delivery_id === null) throw err;
        const found = await model
          .findOne({ tenant_id: d.tenant_id, kind: d.kind, provider_delivery_id: d.provider_delivery_id })
          .lean<Stored<WebhookDelivery>>();
        return fromStored(found);
      }
    },
    async get(tenantId, id) {
      return fromStored(await model.findOne({ _id: id, tenant_id: tenantId }).lean<Stored<WebhookDelivery>>());
    },
    async list(tenantId, q) {
      const filter: Record<string, unknown> = { tenant_id: tenantId, ...(q.kind ? { kind: q.kind } : {}), ...(q.status ? { status: q.status } : {}) };
      const after = decodeCursor(q.cursor);
      if (after) filter._id = { $lt: after };
      const rows = await model
        .find(filter)
        .sort({ _id: -1 })
        .limit(q.limit + 1)
        .lean<Stored<WebhookDelivery>[]>();
      return toPage(
        rows.map((r) => fromStored(r)!),
        q.limit,
      );
    },
    async update(tenantId, id, changes, ifStatusIn) {
      const updated = await model
        .findOneAndUpdate({ _id: id, tenant_id: tenantId, status: { $in: ifStatusIn } }, { $set: definedOnly(changes) }, { returnDocument: 'after' })
        .lean<Stored<WebhookDelivery>>();
      return fromStored(updated);
    },
    async listStale(status, receivedBefore, limit) {
      const rows = await model
        .find({ status, received_at: { $lt: receivedBefore } })
        .sort({ received_at: 1 })
        .limit(limit)
        .lean<Stored<WebhookDelivery>[]>();
      return rows.map((r) => fromStored(r)!);
    },
  };
}
