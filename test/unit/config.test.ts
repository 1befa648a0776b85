import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ConfigError, parseEnv } from '../../config/env.js';
import { buildIsCurrent } from '../../config/paths.js';
import { parseRedisUrl, redactUrl } from '../../engine/platform/index.js';

describe('config/env', () => {
  it('gives every variable of DESIGN.md its default', () => {
    const c = parseEnv({});
    expect(c.port).to.equal(8080);
    expect(c.redisUrl).to.equal('redis://127.0.0.1:6379');
    expect(c.mongodbUri).to.equal(undefined);
    expect(c.dataDir).to.equal(path.resolve('data'));
    expect(c.queuePrefix).to.equal('svc');
    expect(c.apiKeys).to.deep.equal([]);
    expect(c.auth).to.equal('required');
    expect(c.workspaceRoot).to.equal(path.resolve('workspaces'));
    expect(c.auditAllowSensitivePaths).to.equal(false);
    expect(c.adminKeys).to.deep.equal([]);
    expect(c.tenantMaxRunning).to.equal(10);
    expect(c.webhookReplayWindowSeconds).to.equal(300);
    expect(c.webhookRateLimitPerMinute).to.equal(1200);
    expect(parseEnv({ SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: '30', SERVICE_WEBHOOK_REPLAY_WINDOW_SECONDS: '60' })).to.deep.include({
      webhookRateLimitPerMinute: 30,
      webhookReplayWindowSeconds: 60,
    });
    expect(c.logLevel).to.equal('info');
    expect(c.redisUrlSet).to.equal(false);
    expect(c.workerMetricsPort).to.equal(undefined);
    expect(parseEnv({ REDIS_URL: 'redis://127.0.0.1:6379', SERVICE_WORKER_METRICS_PORT: '9464' })).to.deep.include({
      redisUrlSet: true,
      workerMetricsPort: 9464,
    });
  });

  it('refuses a SERVICE_ variable that is no setting (a misspelled one was taken as its default), naming the one meant', () => {
    const refused = (env: Record<string, string>) => {
      try {
        parseEnv(env);
      } catch (err) {
        if (err instanceof ConfigError) return err.message;
        throw err;
      }
      return 'accepted';
    };
    const message = refused({ SERVICE_SHUTDOWN_GRACE_SECOND: '120', SERVICE_WORKER_CONCURENCY: '50', SERVICE_SOMETHING_ELSE: 'x' });
    expect(message)
      .to.contain('SERVICE_SHUTDOWN_GRACE_SECOND: not a setting of this service (did you mean SERVICE_SHUTDOWN_GRACE_SECONDS?)')
      .and.contain('SERVICE_WORKER_CONCURENCY: not a setting of this service (did you mean SERVICE_WORKER_CONCURRENCY?)')
      .and.contain("SERVICE_SOMETHING_ELSE: not a setting of this service (the README's configuration table lists them)");
    // named beside the values that are bad
    expect(refused({ SERVICE_ADMIN_KEY: 'k', PORT: 'eighty' }))
      .to.contain('SERVICE_ADMIN_KEY: not a setting')
      .and.contain('PORT');
    // the CLI's own variables share the prefix, and so do the links Kubernetes sets for a Service named `service`
    expect(parseEnv({ SERVICE_URL: 'http://x', SERVICE_API_KEY: 'sk_x' }).port).to.equal(8080);
    const links = { SERVICE_SERVICE_HOST: '10.0.0.1', SERVICE_SERVICE_PORT: '80', SERVICE_SERVICE_PORT_HTTP: '80', SERVICE_PORT: 'tcp://10.0.0.1:80' };
    const link80 = {
      SERVICE_PORT_80_TCP: 'tcp://10.0.0.1:80',
      SERVICE_PORT_80_TCP_PROTO: 'tcp',
      SERVICE_PORT_80_TCP_PORT: '80',
      SERVICE_PORT_80_TCP_ADDR: '10.0.0.1',
    };
    expect(parseEnv({ ...links, ...link80 }).port).to.equal(8080);
    expect(refused({ SERVICE_WORKER_METRIC_PORT: '9100' })).to.contain('did you mean SERVICE_WORKER_METRICS_PORT?');
  });

  it('refuses NODE_ENV written as production in another case or short (every production guard was off)', () => {
    for (const value of ['Production', 'PRODUCTION', 'prod', 'Prod'])
      expect(() => parseEnv({ NODE_ENV: value, SERVICE_AUTH: 'none' }), value).to.throw(ConfigError, 'NODE_ENV: write production, in lower case');
    expect(parseEnv({ NODE_ENV: 'staging' }).isProduction).to.equal(false);
    expect(
      parseEnv({
        NODE_ENV: ' production ',
        SERVICE_STORE: 'sqlite',
        SERVICE_SECRET_KEY: 'ab'.repeat(32),
        SERVICE_EVIDENCE_KEY: 'cd'.repeat(32),
        SERVICE_SANDBOX: 'none',
      }).isProduction,
    ).to.equal(true);
  });

  it('parses tenant:key pairs and admin keys', () => {
    const c = parseEnv({ SERVICE_API_KEYS: 'acme:0123456789abcdef0, beta:fedcba9876543210x', SERVICE_ADMIN_KEYS: 'admin0123456789abc' });
    expect(c.apiKeys).to.deep.equal([
      { tenantId: 'acme', key: '0123456789abcdef0' },
      { tenantId: 'beta', key: 'fedcba9876543210x' },
    ]);
    expect(c.adminKeys).to.deep.equal(['admin0123456789abc']);
  });

  it('keeps SERVICE_CORS_ORIGINS as a browser sends an Origin, and refuses what no Origin is', () => {
    const c = parseEnv({ SERVICE_CORS_ORIGINS: 'https://App.Example.com, https://web.example.com:443, http://localhost:5173/, HTTPS://X.example' });
    expect(c.corsOrigins).to.deep.equal(['https://app.example.com', 'https://web.example.com', 'http://localhost:5173', 'https://x.example']);
    for (const bad of [
      'https://app.example.com/path',
      'https://user@app.example.com',
      'https://app.example.com?x=1',
      'ftp://app.example.com',
      'app.example.com',
    ])
      expect(() => parseEnv({ SERVICE_CORS_ORIGINS: bad }), bad).to.throw(ConfigError, /SERVICE_CORS_ORIGINS/);
  });

  it('reads 1/0 and true/false flags correctly', () => {
    for (const [v, on] of [
      ['1', true],
      ['true', true],
      ['Yes', true],
      ['0', false],
      ['false', false],
      ['', false],
    ] as const)
      expect(parseEnv({ SERVICE_SANDBOX_ALLOW_NETWORK: v }).sandbox.allowNetwork, v).to.equal(on);
  });

  it('opens /etc, /proc and /sys to audits only when SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS equals 1 (SPEC), and refuses any other value than 0 at start', () => {
    expect(parseEnv({ SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS: '1' }).auditAllowSensitivePaths).to.equal(true);
    expect(parseEnv({ SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS: '0' }).auditAllowSensitivePaths).to.equal(false);
    expect(parseEnv({}).auditAllowSensitivePaths).to.equal(false);
    for (const v of ['true', 'yes', 'on', '01'])
      expect(() => parseEnv({ SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS: v }), v).to.throw(
        ConfigError,
        /SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS.*expected 1 \(on\) or 0 \(off\)/,
      );
  });

  it('names every bad variable in one error', () => {
    try {
      parseEnv({
        PORT: 'eighty',
        REDIS_URL: 'http://x',
        SERVICE_AUTH: 'maybe',
        SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS: 'perhaps',
        SERVICE_TENANT_MAX_RUNNING: '0',
        SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: '-1',
        SERVICE_SECRET_KEY: 'short',
        SERVICE_EVIDENCE_KEY: 'short',
      });
      expect.fail('should have thrown');
    } catch (err) {
      expect(err).to.be.instanceOf(ConfigError);
      const text = (err as Error).message;
      for (const name of [
        'PORT',
        'REDIS_URL',
        'SERVICE_AUTH',
        'SERVICE_AUDIT_ALLOW_SENSITIVE_PATHS',
        'SERVICE_TENANT_MAX_RUNNING',
        'SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE',
        'SERVICE_SECRET_KEY',
        'SERVICE_EVIDENCE_KEY',
      ]) {
        expect(text).to.contain(name);
      }
    }
    // what variables say together is named too, beside one that does not read
    expect(() => parseEnv({ PORT: 'abc', SERVICE_TRANSCRIBE_PROVIDER: 'openai', SERVICE_OIDC_CLIENT_SECRET: 'x' }))
      .to.throw(ConfigError)
      .with.property('message')
      .that.contains('PORT:')
      .and.contains('SERVICE_TRANSCRIBE_API_KEY: required')
      .and.contains('set all four for sign-in, or none');
  });

  it('refuses SERVICE_AUTH=none and a missing secret or evidence key in production', () => {
    expect(() => parseEnv({ NODE_ENV: 'production', SERVICE_AUTH: 'none' })).to.throw(ConfigError, /SERVICE_AUTH[\s\S]*SERVICE_SECRET_KEY/);
    const keys = { SERVICE_SECRET_KEY: 'ab'.repeat(32), SERVICE_EVIDENCE_KEY: 'cd'.repeat(32) };
    expect(() => parseEnv({ NODE_ENV: 'production', SERVICE_STORE: 'sqlite', ...keys })).not.to.throw();
    expect(() => parseEnv({ NODE_ENV: 'production', SERVICE_STORE: 'sqlite', SERVICE_SECRET_KEY: 'ab'.repeat(32) })).to.throw(
      ConfigError,
      /SERVICE_EVIDENCE_KEY: required/,
    );
  });

  it('wants MONGODB_URI in production unless SERVICE_STORE=sqlite makes the embedded store an explicit choice', () => {
    const prod = { NODE_ENV: 'production', SERVICE_SECRET_KEY: 'ab'.repeat(32), SERVICE_EVIDENCE_KEY: 'cd'.repeat(32) };
    expect(() => parseEnv(prod)).to.throw(ConfigError, /MONGODB_URI: required when NODE_ENV=production[\s\S]*SERVICE_STORE=sqlite/);
    expect(parseEnv({ ...prod, SERVICE_STORE: 'sqlite' }).store).to.equal('sqlite');
    expect(parseEnv({ ...prod, MONGODB_URI: 'mongodb://db/svc' }).store).to.equal('mongo');
    expect(parseEnv({}).store).to.equal('sqlite');
    expect(() => parseEnv({ SERVICE_STORE: 'mongo' })).to.throw(ConfigError, /"mongo" needs MONGODB_URI/);
    expect(() => parseEnv({ SERVICE_STORE: 'sqlite', MONGODB_URI: 'mongodb://db/svc' })).to.throw(ConfigError, /pick one store/);
    expect(() => parseEnv({ SERVICE_STORE: 'postgres' })).to.throw(ConfigError, /SERVICE_STORE: expected "sqlite" or "mongo"/);
    // a replica set's seed list, with ports, is the usual production string (and no WHATWG URL)
    for (const uri of [
      'mongodb://db1:27017,db2:27017,db3:27017/automation?replicaSet=rs0',
      'mongodb+srv://u:p@cluster0.example.net/app',
      'mongodb://u:p@h1,h2/db',
      'mongodb://localhost:27017?replicaSet=rs0',
    ])
      expect(parseEnv({ ...prod, MONGODB_URI: uri }).mongodbUri, uri).to.equal(uri);
    for (const uri of ['http://db/svc', 'mongodb:/db', 'mongodb://', 'db:27017'])
      expect(() => parseEnv({ ...prod, MONGODB_URI: uri }), uri).to.throw(
        ConfigError,
        /MONGODB_URI: expected a mongodb:\/\/ or mongodb\+srv:\/\/ connection string/,
      );
  });

  it('holds a local tool that starts no service (gates run) to the rules that are not a service’s, in production too', () => {
    expect(() => parseEnv({ NODE_ENV: 'production' })).to.throw(ConfigError, /SERVICE_SECRET_KEY: required/);
    const local = parseEnv({ NODE_ENV: 'production' }, { service: false });
    expect(local.isProduction).to.equal(true);
    // what is wrong whatever runs is still refused
    expect(() => parseEnv({ NODE_ENV: 'production', SERVICE_SHUTDOWN_GRACE_SECONDS: 'soon' }, { service: false })).to.throw(ConfigError, /SHUTDOWN_GRACE/);
  });

  it('reads whole numbers as digits only, and keys as hex or base64 of exactly 32 bytes', () => {
    expect(parseEnv({ SERVICE_SHUTDOWN_GRACE_SECONDS: ' 30 ' }).shutdownGraceSeconds).to.equal(30);
    for (const v of ['0x1E', '1e3', '0b11', '3.0', '-1'])
      expect(() => parseEnv({ SERVICE_SHUTDOWN_GRACE_SECONDS: v }), v).to.throw(ConfigError, /SERVICE_SHUTDOWN_GRACE_SECONDS: expected a whole number/);
    const b64 = Buffer.alloc(32, 7).toString('base64');
    for (const key of [b64, b64.replace(/=+$/, ''), 'ab'.repeat(32)]) expect(() => parseEnv({ SERVICE_SECRET_KEY: key }), key).to.not.throw();
    // Buffer.from skips what is not base64: 32 zero bytes hid behind four characters it dropped
    for (const key of ['!!!!' + 'A'.repeat(43), `${b64}AA`, 'ab'.repeat(31)])
      expect(() => parseEnv({ SERVICE_SECRET_KEY: key }), key).to.throw(ConfigError, /SERVICE_SECRET_KEY: expected 32 bytes/);
  });

  it('refuses notification tries whose doubled waits would pass 7 days (50 tries overflowed a date)', () => {
    expect(() => parseEnv({ SERVICE_NOTIFY_ATTEMPTS: '50' })).to.throw(
      ConfigError,
      /SERVICE_NOTIFY_ATTEMPTS, SERVICE_NOTIFY_BACKOFF_MS: 50 tries.*at most 7 days/,
    );
    expect(parseEnv({ SERVICE_NOTIFY_ATTEMPTS: '17', SERVICE_NOTIFY_BACKOFF_MS: '5000' }).notify.attempts).to.equal(17);
    expect(() => parseEnv({ SERVICE_NOTIFY_ATTEMPTS: '18', SERVICE_NOTIFY_BACKOFF_MS: '5000' })).to.throw(ConfigError, /at most 7 days/);
    expect(parseEnv({ SERVICE_NOTIFY_ATTEMPTS: '1', SERVICE_NOTIFY_BACKOFF_MS: '3600000' }).notify.attempts).to.equal(1);
  });

  it('wants the agent endpoint whole: its URL and model together, or neither (a key alone is half of one)', () => {
    const url = 'http://127.0.0.1:9/v1';
    for (const half of [{ SERVICE_AGENT_BASE_URL: url }, { SERVICE_AGENT_MODEL: 'm' }, { SERVICE_AGENT_API_KEY: 'sk-secret', SERVICE_AGENT_BASE_URL: url }])
      expect(() => parseEnv(half), JSON.stringify(half))
        .to.throw(ConfigError, /SERVICE_AGENT_BASE_URL, SERVICE_AGENT_MODEL: set both/)
        .that.satisfies((e: Error) => !e.message.includes('sk-secret'));
    expect(parseEnv({ SERVICE_AGENT_BASE_URL: url, SERVICE_AGENT_MODEL: 'm' }).agent).to.include({ baseUrl: url, model: 'm' });
    expect(parseEnv({}).agent.baseUrl).to.equal(undefined);
  });

  it('takes a sign-in tenant map whose claim values hold colons and whose tenants sign-in takes, and an https redirect in production', () => {
    const oidc = {
      SERVICE_OIDC_ISSUER: 'https://idp.example.com',
      SERVICE_OIDC_CLIENT_ID: 'svc',
      SERVICE_OIDC_CLIENT_SECRET: 'secret',
      SERVICE_OIDC_REDIRECT_URL: 'https://svc.example.com/auth/callback',
    };
    const map = parseEnv({ ...oidc, SERVICE_OIDC_TENANT_MAP: 'urn:org:acme:tenant-a,org-b:b' }).oidc!.tenantMap;
    expect(map).to.deep.equal({ 'urn:org:acme': 'tenant-a', 'org-b': 'b' });
    // a tenant no sign-in could ever open (it must start with a letter or digit), or no claim value at all
    for (const bad of ['org-acme:-x', 'org-acme:_x', ':tenant-a', 'org-acme:', `org:${'x'.repeat(65)}`])
      expect(() => parseEnv({ ...oidc, SERVICE_OIDC_TENANT_MAP: bad }), bad).to.throw(ConfigError, /SERVICE_OIDC_TENANT_MAP/);
    // in production the redirect is https, as the issuer is: the sign-in's cookies are Secure
    const prod = { NODE_ENV: 'production', SERVICE_STORE: 'sqlite', SERVICE_SECRET_KEY: 'ab'.repeat(32), SERVICE_EVIDENCE_KEY: 'cd'.repeat(32) };
    expect(() => parseEnv({ ...prod, ...oidc })).not.to.throw();
    expect(() => parseEnv({ ...prod, ...oidc, SERVICE_OIDC_REDIRECT_URL: 'http://svc.example.com/auth/callback' })).to.throw(
      ConfigError,
      /SERVICE_OIDC_REDIRECT_URL: must be https when NODE_ENV=production/,
    );
  });

  it('never echoes an API key in its error', () => {
    expect(() => parseEnv({ SERVICE_API_KEYS: 'acme:short-secret' }))
      .to.throw(ConfigError)
      .that.satisfies((e: Error) => !e.message.includes('short-secret'));
  });

  it("reads REDIS_URL as one server or a cluster's nodes, and wants a hash-tagged prefix on a cluster", () => {
    // a password, in the user info or the query (ioredis takes ?password=), never reaches a message or the banner
    expect(redactUrl('redis://:p%40ss@h:1/2')).to.equal('redis://:***@h:1/2');
    expect(redactUrl('redis://h:6379/0?password=QuerySecret123&db=1')).to.equal('redis://h:6379/0?password=***&db=1');
    expect(redactUrl('rediss://u:p@a:7000,b:7001,[::1]:7002')).to.equal('rediss://u:***@a:7000,b:7001,[::1]:7002');
    expect(redactUrl('redis://h:1')).to.equal('redis://h:1');
    // a cluster's password may hold ? and # (parseRedisUrl takes them, and the service connects with them)
    expect(redactUrl('redis://:hunter2?topsecret@127.0.0.1:1,127.0.0.1:2')).to.equal('redis://:***@127.0.0.1:1,127.0.0.1:2');
    expect(redactUrl('redis://default:hunter2#more@a:1,b:2')).to.equal('redis://default:***@a:1,b:2');
    expect(parseRedisUrl('redis://:p%40ss@h:1/2')).to.deep.equal({ cluster: false, nodes: [{ host: 'h', port: 1 }], password: 'p@ss', db: 2, tls: false });
    // a password written with its @ unencoded runs to the last @: no part of it is taken for a host, or printed
    expect(parseRedisUrl('redis://:p@ss@h:1')).to.deep.include({ nodes: [{ host: 'h', port: 1 }], password: 'p@ss' });
    expect(redactUrl('redis://:se@cr:et@h:1,g:2')).to.equal('redis://:***@h:1,g:2');
    expect(() => parseEnv({ REDIS_URL: 'redis://:se@cr/et@h:1' }))
      .to.throw(ConfigError)
      .with.property('message')
      .that.does.not.match(/cr|et@/);
    expect(parseRedisUrl('rediss://u:p@a:7000,b:7001,[::1]:7002')).to.deep.equal({
      cluster: true,
      nodes: [
        { host: 'a', port: 7000 },
        { host: 'b', port: 7001 },
        { host: '::1', port: 7002 },
      ],
      username: 'u',
      password: 'p',
      tls: true,
    });
    expect(parseRedisUrl('redis://h/0?family=6').nodes).to.deep.equal([{ host: 'h', port: 6379 }]);
    expect(() => parseEnv({ REDIS_URL: 'http://h:1' })).to.throw(ConfigError, /REDIS_URL/);
    expect(() => parseEnv({ REDIS_URL: 'redis://a:1,b:2', SERVICE_QUEUE_PREFIX: 'svc' })).to.throw(ConfigError, /hash tag/);
    expect(parseEnv({ REDIS_URL: 'redis://a:1,b:2', SERVICE_QUEUE_PREFIX: '{svc}' }).queuePrefix).to.equal('{svc}');
    expect(() => parseEnv({ SERVICE_QUEUE_PREFIX: '{a}{b}' })).to.throw(ConfigError, /SERVICE_QUEUE_PREFIX/);
  });
});

describe('config/paths buildIsCurrent', () => {
  it('says dist/ is current only while no source the build compiles is newer than its record', () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-test-build-'));
    try {
      fs.writeFileSync(path.join(root, 'tsconfig.build.json'), JSON.stringify({ include: ['main.ts', 'engine'] }));
      fs.mkdirSync(path.join(root, 'engine', 'deep'), { recursive: true });
      const past = new Date(Date.now() - 60_000);
      for (const file of ['main.ts', 'engine/deep/a.ts']) {
        fs.writeFileSync(path.join(root, file), 'export {};\n');
        fs.utimesSync(path.join(root, file), past, past);
      }
      expect(buildIsCurrent(root), 'no build').to.equal(false);
      fs.mkdirSync(path.join(root, 'dist'));
      fs.writeFileSync(path.join(root, 'dist', '.tsbuildinfo'), '{}');
      expect(buildIsCurrent(root)).to.equal(true);
      // a file that is not TypeScript, or is outside what the build compiles, changes nothing
      fs.writeFileSync(path.join(root, 'engine', 'notes.md'), 'x');
      fs.writeFileSync(path.join(root, 'other.ts'), 'x');
      expect(buildIsCurrent(root)).to.equal(true);
      const later = new Date(Date.now() + 60_000);
      fs.utimesSync(path.join(root, 'engine', 'deep', 'a.ts'), later, later);
      expect(buildIsCurrent(root), 'a source edited after the build').to.equal(false);
    } finally {
      fs.rmSync(root, { recursive: true, force: true });
    }
  });
});
