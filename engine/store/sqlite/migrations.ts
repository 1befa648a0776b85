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
