// Applied in order; PRAGMA user_version records how many have run. Never edit one that has shipped.
export const MIGRATIONS: string[] = [
  `
  CREATE TABLE automations (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    status TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX automations_by_tenant ON automations (tenant_id, id);
  CREATE INDEX automations_by_tenant_status ON automations (tenant_id, status, id);
  CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    doc TEXT NOT NULL
  );
  CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, id);
  `,
];
MIGRATIONS.push(`
  CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    automation_id TEXT,
    session_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    duration_ms INTEGER,
    doc TEXT NOT NULL
  );
  CREATE INDEX runs_by_automation ON runs (tenant_id, automation_id, id);
  CREATE INDEX runs_by_session ON runs (tenant_id, session_id, id);
  CREATE INDEX runs_by_kind_finished ON runs (tenant_id, kind, finished_at);
  CREATE INDEX runs_by_status_created ON runs (status, created_at);
`);
MIGRATIONS.push(`
  CREATE TABLE webhook_secrets (
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (tenant_id, kind)
  );
  CREATE TABLE deliveries (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    provider_delivery_id TEXT,
    received_at TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, id);
  CREATE INDEX deliveries_by_kind ON deliveries (tenant_id, kind, id);
  -- status first: it serves a tenant's status filter and the reconciler's scan of received deliveries
  -- (few at any time) in one index, one B-tree less for every insert
  CREATE INDEX deliveries_by_status ON deliveries (status, tenant_id, id);
  CREATE UNIQUE INDEX deliveries_provider_id ON deliveries (tenant_id, kind, provider_delivery_id);
`);
