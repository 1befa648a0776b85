// security: secrets (secretlint's recommended preset, values masked before they become findings),
// private keys and .env files committed, world-writable files and folders, and package.json scripts
// that fetch code and run it (worst in install hooks, which run on every `npm install`).
import fs from 'node:fs/promises';
import path from 'node:path';
import { masked } from './mask.js';
import { Findings, readText, type PhaseOutput, type Workspace } from './workspace.js';

const MAX_FILE_BYTES = 1024 * 1024;
const KEY_FILE = /(^|\/)(id_(rsa|dsa|ecdsa|ed25519)|[^/]+\.(pem|key|p12|pfx|jks|keystore|ppk))$/i;
const ENV_FILE = /(^|\/)\.env(\.[^/]+)?$/;
const ENV_TEMPLATE = /\.(example|sample|template|dist|defaults?|schema)$/i;
const INSTALL_HOOKS = new Set(['preinstall', 'install', 'postinstall', 'prepare', 'preprepare', 'postprepare', 'prepublish']);
const RISKY: { rule: string; pattern: RegExp; what: string }[] = [
  { rule: 'script-pipes-download-to-shell', pattern: /\b(curl|wget)\b[^|;&]*\|\s*(sudo\s+)?(ba|z|da|k)?sh\b/, what: 'pipes a download into a shell' },
  { rule: 'script-runs-decoded-payload', pattern: /base64\s+(-d|--decode)\b[^|;&]*\|\s*(sudo\s+)?(ba|z|da)?sh\b/, what: 'runs a decoded payload' },
  { rule: 'script-evaluates-remote-code', pattern: /\b(eval|node\s+-e|python3?\s+-c)\b.*https?:\/\//, what: 'evaluates code fetched from the network' },
  { rule: 'script-downloads', pattern: /\b(curl|wget)\b/, what: 'downloads from the network' },
];

export async function securityPhase(ws: Workspace, findings: Findings): Promise<PhaseOutput['metrics']> {
  let scanned = 0;
  let notScanned = 0;
  const withSecretKey = new Set<string>();
  // the gates' scan, the same code: every file whatever its size (a chunk at a time) or content (binary-looking
  // ones as latin1 bytes); a file over 1 MB or with a NUL in its first 8 KiB was skipped, and the report passed.
  // Loaded here, not with the module: the other phases of this process do not scan.
  const { scanFileSecrets } = await import('../../gates/index.js');
  for (const rel of ws.files) {
    const done = await scanFileSecrets(ws.root, rel, (m) => {
      if (m.ruleId.includes('privatekey')) withSecretKey.add(rel);
      findings.add(`secret:${m.ruleId.replace('@secretlint/secretlint-rule-', '')}`, 'critical', rel, m.line, m.message);
    });
    if (done === true) scanned++;
    else if (done !== null) {
      // not scanned is never silence: the report would say the file holds no secret
      notScanned++;
      findings.add('file-not-scanned', 'medium', rel, null, `${rel} could not be scanned for secrets (${done}): it is not known to hold none`);
    }
  }

  // what could not even be listed or looked at: a folder's files, or a file, the scan never reached
  for (const { path: rel, why } of ws.unreadable) {
    notScanned++;
    const what = rel.endsWith('/') ? `the folder ${rel} could not be read (${why}): its files were not` : `${rel} could not be read (${why}): it was not`;
    findings.add('file-not-scanned', 'medium', rel, null, `${what} scanned for secrets, and is not known to hold none`);
  }

  const committed = (rel: string) => (ws.tracked ? ws.tracked.has(rel) : true);
  // where git's state could not be read, whether a file is committed or ignored is not known: never said either way
  const where = ws.tracked ? 'committed' : ws.gitUnknown ? 'in the workspace (whether git tracks it is unknown)' : 'in the workspace';
  for (const rel of ws.files) {
    if (KEY_FILE.test(rel) && committed(rel) && !withSecretKey.has(rel))
      findings.add('private-key-file', 'high', rel, null, `${path.basename(rel)} looks like a private key or keystore and is ${where}`);
    if (ENV_FILE.test(rel) && !ENV_TEMPLATE.test(rel)) {
      if (!ws.tracked && ws.gitUnknown)
        findings.add(
          'env-file-present',
          'medium',
          rel,
          null,
          `${rel} is in the workspace, and whether git commits or ignores it is unknown (${ws.gitUnknown}): environment files hold secrets`,
        );
      else if (committed(rel))
        findings.add(
          'env-file-committed',
          'high',
          rel,
          null,
          `${rel} is ${ws.tracked ? 'committed' : 'in the workspace (not a git repository)'}: environment files hold secrets`,
        );
      else findings.add('env-file-not-ignored', 'medium', rel, null, `${rel} is not ignored by git: one \`git add .\` commits it`);
    }
  }

  // world-writable: the files, and the folders they are in (lstat: a link's own mode means nothing)
  const dirs = new Set<string>(['.']);
  for (const rel of ws.files) for (let d = path.dirname(rel); d !== '.'; d = path.dirname(d)) dirs.add(d);
  let worldWritable = 0;
  for (const rel of [...ws.files, ...dirs]) {
    const st = await fs.lstat(path.join(ws.root, rel)).catch(() => null);
    if (!st || st.isSymbolicLink() || (st.mode & 0o002) === 0 || (st.isDirectory() && (st.mode & 0o1000) !== 0)) continue;
    worldWritable++;
    findings.add(
      'world-writable',
      'medium',
      rel === '.' ? null : rel,
      null,
      `${rel === '.' ? 'the workspace root' : rel} is writable by every user${st.isDirectory() ? ' (a folder without the sticky bit)' : ''}`,
    );
  }

  let manifests = 0;
  for (const rel of ws.files.filter((f) => f === 'package.json' || f.endsWith('/package.json'))) {
    const text = await readText(ws.root, rel, MAX_FILE_BYTES);
    let scripts: Record<string, unknown> = {};
    try {
      scripts = (JSON.parse(text ?? '{}') as { scripts?: Record<string, unknown> }).scripts ?? {};
    } catch {
      continue; // sanity reports a manifest that does not parse
    }
    manifests++;
    const lines = (text ?? '').split('\n');
    for (const [name, command] of Object.entries(scripts)) {
      if (typeof command !== 'string') continue;
      const risk = RISKY.find((r) => r.pattern.test(command));
      if (!risk) continue;
      const hook = INSTALL_HOOKS.has(name);
      // a plain download in an ordinary script is common (fetching a fixture); in an install hook it is not
      if (risk.rule === 'script-downloads' && !hook) continue;
      const line = lines.findIndex((l) => l.includes(`"${name}"`)) + 1 || null;
      const shown = await masked(command.match(risk.pattern)![0].slice(0, 200));
      findings.add(risk.rule, hook ? 'high' : 'medium', rel, line, `the ${hook ? 'install hook' : 'script'} "${name}" ${risk.what}: ${shown}`);
    }
  }
  return { files_scanned: scanned, files_not_scanned: notScanned, files: ws.files.length, world_writable: worldWritable, manifests };
}
