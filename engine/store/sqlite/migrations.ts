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
// Steps and agent turns leave the run's document for rows of their own, per attempt; runs gain
// attempts, a retry policy and a link to the run they re-run; lists of a tenant's runs get indexes.
MIGRATIONS.push(`
  CREATE TABLE run_steps (
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (run_id, attempt, idx)
  ) WITHOUT ROWID;
  CREATE TABLE run_turns (
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (run_id, attempt, idx)
  ) WITHOUT ROWID;
  INSERT INTO run_steps (run_id, attempt, idx, tenant_id, doc)
    SELECT runs.id, 1, s.value ->> '$.index', runs.tenant_id, s.value FROM runs, json_each(runs.doc, '$.steps') AS s;
  INSERT INTO run_turns (run_id, attempt, idx, tenant_id, doc)
    SELECT runs.id, 1, t.value ->> '$.index', runs.tenant_id, t.value FROM runs, json_each(runs.doc, '$.agent_turns') AS t;
  UPDATE runs SET doc = json_set(
    json_remove(doc, '$.steps', '$.agent_turns', '$.idempotency_key'),
    '$.plan', CASE WHEN doc ->> '$.goal' IS NULL
      THEN (SELECT json_group_array(json_object('tool', s.value ->> '$.tool', 'args', json(s.value -> '$.args'), 'name', s.value ->> '$.name'))
            FROM json_each(doc, '$.steps') AS s WHERE s.value ->> '$.source' = 'plan')
      ELSE NULL END,
    '$.attempt', 1, '$.attempts', json('[]'), '$.retry', NULL, '$.rerun_of', NULL);
  UPDATE automations SET doc = json_set(doc, '$.retry', NULL);
  CREATE INDEX runs_by_tenant ON runs (tenant_id, id);
  CREATE INDEX runs_by_tenant_status ON runs (tenant_id, status, id);
`);
// Runs and automations say whether their tools may use the network; runs, which sandbox ran them.
MIGRATIONS.push(`
  UPDATE runs SET doc = json_set(doc, '$.network', json('false'), '$.sandbox', NULL);
  UPDATE automations SET doc = json_set(doc, '$.network', json('false'));
`);
// Sessions, their agents and their durable message log (ordered by a per-session seq).
MIGRATIONS.push(`
  CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX sessions_by_tenant ON sessions (tenant_id, id);
  CREATE INDEX sessions_by_tenant_status ON sessions (tenant_id, status, id);
  CREATE TABLE agents (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX agents_by_session ON agents (tenant_id, session_id, id);
  CREATE TABLE messages (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    tenant_id TEXT NOT NULL,
    id TEXT NOT NULL UNIQUE,
    doc TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
  ) WITHOUT ROWID;
`);
// The tasks of multi-agent sessions: ids are the session's own (chosen by callers or the service).
MIGRATIONS.push(`
  CREATE TABLE tasks (
    tenant_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (tenant_id, session_id, id)
  ) WITHOUT ROWID;
  CREATE INDEX tasks_by_status_updated ON tasks (status, updated_at);
`);
// The reconciler finds sessions whose status has not moved for a while.
MIGRATIONS.push(`
  CREATE INDEX sessions_by_status_updated ON sessions (status, json_extract(doc, '$.updated_at'));
`);
// The evidence ledger: one chain per tenant, and its payloads by digest.
MIGRATIONS.push(`
  CREATE TABLE ledger (
    tenant_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (tenant_id, seq)
  ) WITHOUT ROWID;
  CREATE INDEX ledger_by_at ON ledger (tenant_id, at);
  CREATE TABLE ledger_payloads (
    tenant_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant_id, digest)
  ) WITHOUT ROWID;
`);
// Gate runs, and each gate's result (the latest per workspace and gate answers smart gates).
MIGRATIONS.push(`
  CREATE TABLE gate_runs (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    workspace TEXT NOT NULL,
    status TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX gate_runs_by_workspace ON gate_runs (tenant_id, workspace, id);
  CREATE INDEX gate_runs_by_tenant ON gate_runs (tenant_id, id);
  CREATE TABLE gate_results (
    tenant_id TEXT NOT NULL,
    gate_run_id TEXT NOT NULL,
    gate_id TEXT NOT NULL,
    workspace TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    doc TEXT NOT NULL,
    PRIMARY KEY (tenant_id, gate_run_id, gate_id)
  ) WITHOUT ROWID;
  CREATE INDEX gate_results_latest ON gate_results (tenant_id, workspace, gate_id, finished_at);
`);
// An append writes the fewest pages it can: entries are found by seq, and `since` scans them in seq
// order (their times only grow), so the index by time is dropped.
MIGRATIONS.push(`
  DROP INDEX IF EXISTS ledger_by_at;
`);
// The reconciler finds gate runs that are still running.
MIGRATIONS.push(`
  CREATE INDEX gate_runs_by_status ON gate_runs (status, json_extract(doc, '$.created_at'));
`);
// Connections: a tenant's provider credentials (sealed in the document), one name per tenant.
MIGRATIONS.push(`
  CREATE TABLE connections (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    name TEXT NOT NULL,
    doc TEXT NOT NULL,
    UNIQUE (tenant_id, name)
  );
  CREATE INDEX connections_by_provider ON connections (tenant_id, provider, id);
`);
// Outbound notifications: a tenant's endpoints, and each delivery with its attempts.
MIGRATIONS.push(`
  CREATE TABLE notification_endpoints (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX notification_endpoints_by_tenant ON notification_endpoints (tenant_id, id);
  CREATE TABLE notification_deliveries (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    endpoint_id TEXT NOT NULL,
    doc TEXT NOT NULL
  );
  CREATE INDEX notification_deliveries_by_endpoint ON notification_deliveries (tenant_id, endpoint_id, id);
  CREATE INDEX notification_deliveries_pending ON notification_deliveries (json_extract(doc, '$.status'), json_extract(doc, '$.updated_at'));
`);
// The reconcilers' indexes hold only what they look for (runs queued or running, multi-agent sessions
// running or waiting, tasks that have not ended): a run, session or task that ends leaves its index
// for good, and a run's session never enters it. The index of finished runs holds finished runs only,
// and the automations' index runs of automations only. Together with the UPDATE that names only the
// columns that change (runs.ts), a run writes fewer pages of the write-ahead log (measured over 5,000
// no-op runs: 7.5 against 9.2 pages a run through the workers, 13.2 against 16.8 a run created).
MIGRATIONS.push(`
  DROP INDEX runs_by_status_created;
  CREATE INDEX runs_live_by_created ON runs (status, created_at) WHERE status IN ('queued', 'running');
  DROP INDEX sessions_by_status_updated;
  CREATE INDEX sessions_live_by_updated ON sessions (status, json_extract(doc, '$.updated_at'))
    WHERE kind = 'multi_agent' AND status IN ('running', 'waiting');
  DROP INDEX runs_by_kind_finished;
  CREATE INDEX runs_finished_by_kind ON runs (tenant_id, kind, finished_at) WHERE finished_at IS NOT NULL;
  DROP INDEX runs_by_automation;
  CREATE INDEX runs_by_automation ON runs (tenant_id, automation_id, id) WHERE automation_id IS NOT NULL;
  DROP INDEX tasks_by_status_updated;
  CREATE INDEX tasks_live_by_updated ON tasks (status, updated_at) WHERE status IN ('pending', 'queued', 'running', 'input_required');
`);
// Tasks keep their place in the order their session's tasks were added (DAG order's tie-break); those
// stored before get theirs from their creation time, as that order was kept until now.
MIGRATIONS.push(`
  UPDATE tasks SET doc = json_set(doc, '$.position', (
    SELECT n FROM (SELECT id AS tid, ROW_NUMBER() OVER (PARTITION BY tenant_id, session_id ORDER BY created_at, id) AS n
                   FROM tasks AS o WHERE o.tenant_id = tasks.tenant_id AND o.session_id = tasks.session_id) WHERE tid = tasks.id));
`);
// The runs by kind and status, counted as they change (the metrics gauge read them with a scan of every
// run at each scrape: 39 ms at 200,000 runs, on the event loop of every process scraped). Triggers keep
// the count in the same transaction as the run's own write; it is one small page the writes share.
MIGRATIONS.push(`
  CREATE TABLE run_counts (kind TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (kind, status)) WITHOUT ROWID;
  INSERT INTO run_counts (kind, status, n) SELECT kind, status, COUNT(*) FROM runs GROUP BY kind, status;
  CREATE TRIGGER run_counts_insert AFTER INSERT ON runs BEGIN
    INSERT INTO run_counts (kind, status, n) VALUES (new.kind, new.status, 1) ON CONFLICT (kind, status) DO UPDATE SET n = n + 1;
  END;
  CREATE TRIGGER run_counts_update AFTER UPDATE OF status ON runs WHEN old.status <> new.status BEGIN
    UPDATE run_counts SET n = n - 1 WHERE kind = old.kind AND status = old.status;
    INSERT INTO run_counts (kind, status, n) VALUES (new.kind, new.status, 1) ON CONFLICT (kind, status) DO UPDATE SET n = n + 1;
  END;
`);
// A body GitHub signed (no time is signed with it) is a replay whenever it comes again, not only within
// the window the intake remembers it in Redis: the accepted deliveries are found by the body's digest.
MIGRATIONS.push(`
  CREATE INDEX deliveries_by_body ON deliveries (tenant_id, kind, json_extract(doc, '$.body_sha256')) WHERE status <> 'rejected';
`);
// The body's digest as a column of its own: the index on the document's field made SQLite parse each
// delivery's JSON as it was stored (webhook intake 8-10% slower); a column costs nothing to index.
MIGRATIONS.push(`
  DROP INDEX deliveries_by_body;
  ALTER TABLE deliveries ADD COLUMN body_sha256 TEXT;
  UPDATE deliveries SET body_sha256 = json_extract(doc, '$.body_sha256');
  CREATE INDEX deliveries_by_body ON deliveries (tenant_id, kind, body_sha256) WHERE status <> 'rejected';
`);
// Idempotency keys kept in the store too (Redis forgets them if it loses its data): one row per key.
MIGRATIONS.push(`
  CREATE TABLE idempotency_keys (
    tenant_id TEXT NOT NULL,
    key_digest TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    run_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant_id, key_digest)
  ) WITHOUT ROWID;
  CREATE INDEX idempotency_keys_by_time ON idempotency_keys (created_at);
`);
// A tenant's automations that are not archived, counted as they change (each create counted them with a
// scan of the tenant's index entries: 109 µs at 1,000 automations, 3.9 ms at 50,000). The same kind of
// trigger-kept count as the runs'.
MIGRATIONS.push(`
  CREATE TABLE automation_counts (tenant_id TEXT PRIMARY KEY, live INTEGER NOT NULL) WITHOUT ROWID;
  INSERT INTO automation_counts (tenant_id, live) SELECT tenant_id, COUNT(*) FROM automations WHERE status <> 'archived' GROUP BY tenant_id;
  CREATE TRIGGER automation_counts_insert AFTER INSERT ON automations WHEN new.status <> 'archived' BEGIN
    INSERT INTO automation_counts (tenant_id, live) VALUES (new.tenant_id, 1) ON CONFLICT (tenant_id) DO UPDATE SET live = live + 1;
  END;
  CREATE TRIGGER automation_counts_update AFTER UPDATE OF status ON automations
    WHEN (old.status = 'archived') <> (new.status = 'archived') BEGIN
    INSERT INTO automation_counts (tenant_id, live) VALUES (new.tenant_id, CASE WHEN new.status = 'archived' THEN -1 ELSE 1 END)
      ON CONFLICT (tenant_id) DO UPDATE SET live = live + excluded.live;
  END;
  CREATE TRIGGER automation_counts_delete AFTER DELETE ON automations WHEN old.status <> 'archived' BEGIN
    UPDATE automation_counts SET live = live - 1 WHERE tenant_id = old.tenant_id;
  END;
`);
// A session's tasks by status, counted as they change: each task's end read its session's counts with a
// GROUP BY over every task row of the session, documents included (63 µs at 100 tasks, 7.4 ms at 10,000: a
// session of 10,000 tasks spent over a minute of CPU on its counts).
MIGRATIONS.push(`
  CREATE TABLE task_counts (
    tenant_id TEXT NOT NULL, session_id TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, session_id, status)
  ) WITHOUT ROWID;
  INSERT INTO task_counts (tenant_id, session_id, status, n) SELECT tenant_id, session_id, status, COUNT(*) FROM tasks GROUP BY tenant_id, session_id, status;
  CREATE TRIGGER task_counts_insert AFTER INSERT ON tasks BEGIN
    INSERT INTO task_counts (tenant_id, session_id, status, n) VALUES (new.tenant_id, new.session_id, new.status, 1)
      ON CONFLICT (tenant_id, session_id, status) DO UPDATE SET n = n + 1;
  END;
  CREATE TRIGGER task_counts_update AFTER UPDATE OF status ON tasks WHEN old.status <> new.status BEGIN
    UPDATE task_counts SET n = n - 1 WHERE tenant_id = old.tenant_id AND session_id = old.session_id AND status = old.status;
    INSERT INTO task_counts (tenant_id, session_id, status, n) VALUES (new.tenant_id, new.session_id, new.status, 1)
      ON CONFLICT (tenant_id, session_id, status) DO UPDATE SET n = n + 1;
  END;
  CREATE TRIGGER task_counts_delete AFTER DELETE ON tasks BEGIN
    UPDATE task_counts SET n = n - 1 WHERE tenant_id = old.tenant_id AND session_id = old.session_id AND status = old.status;
  END;
`);
// The enabled automations by trigger type, one row per type an automation has (written by the store
// beside the automation's own row): the file watcher's refresh every 5 s, the cron reconcile and each
// webhook delivery found them by parsing every automation's triggers (74 ms at 50,000 automations).
MIGRATIONS.push(`
  CREATE TABLE automation_triggers (type TEXT NOT NULL, tenant_id TEXT NOT NULL, id TEXT NOT NULL, PRIMARY KEY (type, tenant_id, id)) WITHOUT ROWID;
  INSERT OR IGNORE INTO automation_triggers (type, tenant_id, id)
    SELECT * FROM (SELECT CASE WHEN j.type = 'object' THEN json_extract(j.value, '$.type') END AS type, a.tenant_id, a.id
                   FROM automations AS a, json_each(a.doc, '$.triggers') AS j WHERE a.status = 'enabled')
    WHERE type IS NOT NULL;
`);
// An automation's runs by status, counted as they change: its status route counted them with a GROUP BY over
// every run it ever had, each row read for its status (0.5 ms at 500 runs, 102 ms at 50,000). The same kind of
// trigger-kept count as run_counts; a run of no automation does not touch it.
MIGRATIONS.push(`
  CREATE TABLE automation_run_counts (
    tenant_id TEXT NOT NULL, automation_id TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, automation_id, status)
  ) WITHOUT ROWID;
  INSERT INTO automation_run_counts (tenant_id, automation_id, status, n)
    SELECT tenant_id, automation_id, status, COUNT(*) FROM runs WHERE automation_id IS NOT NULL GROUP BY tenant_id, automation_id, status;
  CREATE TRIGGER automation_run_counts_insert AFTER INSERT ON runs WHEN new.automation_id IS NOT NULL BEGIN
    INSERT INTO automation_run_counts (tenant_id, automation_id, status, n) VALUES (new.tenant_id, new.automation_id, new.status, 1)
      ON CONFLICT (tenant_id, automation_id, status) DO UPDATE SET n = n + 1;
  END;
  CREATE TRIGGER automation_run_counts_update AFTER UPDATE OF status ON runs WHEN old.status <> new.status AND new.automation_id IS NOT NULL BEGIN
    UPDATE automation_run_counts SET n = n - 1 WHERE tenant_id = old.tenant_id AND automation_id = old.automation_id AND status = old.status;
    INSERT INTO automation_run_counts (tenant_id, automation_id, status, n) VALUES (new.tenant_id, new.automation_id, new.status, 1)
      ON CONFLICT (tenant_id, automation_id, status) DO UPDATE SET n = n + 1;
  END;
`);
// A tenant's multi-agent sessions, newest first (GET /sessions?kind=multi_agent): a page of its few walked every
// session its autonomy and vibe runs had made (19 ms among 30,000). Those sessions, made with each run, never
// enter the index: a run's insert writes nothing more.
MIGRATIONS.push(`
  CREATE INDEX sessions_multi_agent ON sessions (tenant_id, id) WHERE kind = 'multi_agent';
`);

// The reconciler pages through the stale sessions by (updated_at, id): the id in the index keeps the page's order in it.
MIGRATIONS.push(`
  DROP INDEX sessions_live_by_updated;
  CREATE INDEX sessions_live_by_updated ON sessions (status, json_extract(doc, '$.updated_at'), id)
    WHERE kind = 'multi_agent' AND status IN ('running', 'waiting');
`);

// The reconciler pages through running gate runs by (created_at, id) as well.
MIGRATIONS.push(`
  DROP INDEX gate_runs_by_status;
  CREATE INDEX gate_runs_by_status ON gate_runs (status, json_extract(doc, '$.created_at'), id);
`);

// The reconciler pages through pending notification deliveries by (updated_at, id) too.
MIGRATIONS.push(`
  DROP INDEX notification_deliveries_pending;
  CREATE INDEX notification_deliveries_pending ON notification_deliveries (json_extract(doc, '$.status'), json_extract(doc, '$.updated_at'), id);
`);

// What was signed, kept with a delivery whose id the signature does not cover (the generic scheme's
// X-Service-Delivery): its replay under another id is found by it once Redis has lost its claims.
MIGRATIONS.push(`
  ALTER TABLE deliveries ADD COLUMN signed_sha256 TEXT;
  CREATE INDEX deliveries_by_signed ON deliveries (tenant_id, kind, signed_sha256) WHERE signed_sha256 IS NOT NULL;
`);

// The deployment a store belongs to (its queue prefix): processes of another prefix on the same store refuse to start.
MIGRATIONS.push(`
  CREATE TABLE deployment (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
`);

// A report's entry in the ledger, found by its id: an audit whose report Redis lost (or brought back older)
// is finished from the entry it already has, not appended again. Only entries that name a report are indexed.
MIGRATIONS.push(`
  CREATE INDEX ledger_by_report ON ledger (tenant_id, json_extract(doc, '$.subject.report_id'), seq)
    WHERE json_extract(doc, '$.subject.report_id') IS NOT NULL;
`);

// A gate run's entries in the ledger, found by its id: a seal cut off between its entries and the record's
// update is finished from them, not appended again. Only entries that name a gate run are indexed.
MIGRATIONS.push(`
  CREATE INDEX ledger_by_gate_run ON ledger (tenant_id, json_extract(doc, '$.subject.gate_run_id'), seq)
    WHERE json_extract(doc, '$.subject.gate_run_id') IS NOT NULL;
`);

// Payloads in a rowid table, found by a unique index on the key the primary key was: WITHOUT ROWID kept each
// body (a gate's artifacts, up to megabytes) in the key's own b-tree, so finding a small payload read its large
// neighbours too (50 small payloads among 250 of 1 MB: 183 ms, 0.8 ms now that the index leads to the row alone).
// The rows are copied once, in the migrations' transaction; INSERT OR IGNORE still ignores a digest already kept.
MIGRATIONS.push(`
  CREATE TABLE ledger_payloads_rowid (
    tenant_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    body TEXT NOT NULL
  );
  INSERT INTO ledger_payloads_rowid (tenant_id, digest, body) SELECT tenant_id, digest, body FROM ledger_payloads;
  DROP TABLE ledger_payloads;
  ALTER TABLE ledger_payloads_rowid RENAME TO ledger_payloads;
  CREATE UNIQUE INDEX ledger_payloads_by_digest ON ledger_payloads (tenant_id, digest);
`);
// Ended runs are deleted past their retention (SERVICE_RUNS_KEPT_DAYS): the counts kept by triggers count them out.
MIGRATIONS.push(`
  CREATE TRIGGER run_counts_delete AFTER DELETE ON runs BEGIN
    UPDATE run_counts SET n = n - 1 WHERE kind = old.kind AND status = old.status;
  END;
  CREATE TRIGGER automation_run_counts_delete AFTER DELETE ON runs WHEN old.automation_id IS NOT NULL BEGIN
    UPDATE automation_run_counts SET n = n - 1 WHERE tenant_id = old.tenant_id AND automation_id = old.automation_id AND status = old.status;
  END;
`);
// The body and event of a processed or failed delivery are deleted past their retention
// (SERVICE_WEBHOOK_DELIVERIES_KEPT_DAYS); its record stays. Those still to delete are found by the partial index.
MIGRATIONS.push(`
  ALTER TABLE deliveries ADD COLUMN payload_pruned INTEGER NOT NULL DEFAULT 0;
  CREATE INDEX deliveries_payload_kept ON deliveries (received_at) WHERE payload_pruned = 0 AND status IN ('processed', 'failed');
`);
// Archived multi-agent sessions whose work has ended are deleted past their retention (SERVICE_RUNS_KEPT_DAYS),
// found oldest first through this index.
MIGRATIONS.push(`
  CREATE INDEX sessions_archived_by_updated ON sessions (json_extract(doc, '$.updated_at')) WHERE kind = 'multi_agent' AND status = 'archived';
`);
// Readiness writes a row (GET /readyz): a file that takes no write (a full disk, read-only) is not ready.
MIGRATIONS.push(`
  CREATE TABLE readiness (id INTEGER PRIMARY KEY CHECK (id = 1), at TEXT NOT NULL);
`);
// API keys revoked or expired are deleted past their retention (SERVICE_API_KEYS_SPENT_KEPT_DAYS): found by when
// they were spent (the earlier of the two; live keys are not in the index), and by who made them (a key that made
// one still stored is kept).
MIGRATIONS.push(`
  CREATE INDEX api_keys_spent ON api_keys (min(coalesce(json_extract(doc, '$.revoked_at'), json_extract(doc, '$.expires_at')), coalesce(json_extract(doc, '$.expires_at'), json_extract(doc, '$.revoked_at'))))
    WHERE json_extract(doc, '$.source') != 'bootstrap' AND (json_extract(doc, '$.revoked_at') IS NOT NULL OR json_extract(doc, '$.expires_at') IS NOT NULL);
  CREATE INDEX api_keys_by_maker ON api_keys (json_extract(doc, '$.created_by')) WHERE json_extract(doc, '$.created_by') IS NOT NULL;
`);
// Refused requests' records past their week are found oldest first by this index (the prune read every refused
// row by status and sorted them, holding the write lock: 2.8 s with 300,000 of them, every reconciler pass).
MIGRATIONS.push(`
  CREATE INDEX deliveries_rejected_at ON deliveries (received_at) WHERE status = 'rejected';
`);
// A session's tasks in a status, through this index: a message that might answer a waiting task read every task of
// its session, documents and all, to find the one that waits (10,000 pending: 77-153 ms a message).
MIGRATIONS.push(`
  CREATE INDEX tasks_by_session_status ON tasks (tenant_id, session_id, status, created_at, id);
`);
// A task's output (up to 256 KB of its steps' outputs) leaves its document for a column of its own, the row's last: a
// resume or an archive reads every task of its session for its status and runs, and read their outputs too (400
// tasks: 100 MB; at the 10,000-task cap, 2.5 GB). A document SQLite's JSON functions refuse (nested over 1,000
// deep: a step's output is what a tool or a provider answered) keeps its output where it is, which a read takes
// as well: one such row failed the whole migration, and the store did not open.
MIGRATIONS.push(`
  ALTER TABLE tasks ADD COLUMN output TEXT;
  UPDATE tasks SET output = CASE WHEN json_type(doc, '$.output') IN ('object', 'array') THEN json_extract(doc, '$.output') END,
    doc = json_remove(doc, '$.output')
  WHERE json_valid(doc);
`);
// The runs a prune may delete, alone in an index: it walked every old run from the oldest, those it keeps too (a
// multi-agent session's task runs, kept with their session; runs still queued or running), at each reconciler
// pass, under the write lock (100,000 kept task runs of one tenant: 106-148 ms a pass that deleted nothing). A
// tenant's runs and sessions by kind: a list of one kind walked all the tenant's runs or sessions to find it
// (`?kind=vibe` among 100,000 autonomy runs: 78-87 ms, and 167 ms for sessions). The sessions of autonomy runs, one a
// run and most of them, are not in theirs: a page of them is dense in the tenant's own index, and a run's insert
// writes one index entry more, not two (each about 3 µs of a run's creation here).
MIGRATIONS.push(`
  CREATE INDEX runs_prunable ON runs (id) WHERE finished_at IS NOT NULL AND kind <> 'session_task';
  CREATE INDEX runs_by_tenant_kind ON runs (tenant_id, kind, id);
  CREATE INDEX sessions_by_tenant_kind ON sessions (tenant_id, kind, id) WHERE kind <> 'autonomy';
`);
// The reconciler pages through stale runs by (created_at, id): with the id in the index a page is read in its order
// (runs made in the same millisecond were sorted in a temporary tree: 50,000 of them, 111 ms a page).
MIGRATIONS.push(`
  DROP INDEX runs_live_by_created;
  CREATE INDEX runs_live_by_created ON runs (status, created_at, id) WHERE status IN ('queued', 'running');
`);
