// health, the part that reads files: TODO/FIXME/HACK/XXX markers in the sources, and the declared
// dependencies with what the lockfile pins (the service asks a registry which are outdated, outside
// the sandbox; stale gate results come from the service's store).
import { masked } from './mask.js';
import { declared, npmLock, readJson, type Manifest } from './sanity.js';
import { Findings, readText, type PhaseOutput, type Workspace } from './workspace.js';

/** a marker as a comment opens it: `// TODO: ...`, `# FIXME ...`, `* HACK(name) ...` */
const MARKER = /(?:\/\/|\/\*|#|^\s*\*|<!--|--)\s*(TODO|FIXME|HACK|XXX)\b(?:\([^)]*\))?:?\s*(.{0,120})/;
const TEXT_SOURCE = /\.([cm]?[jt]sx?|py|go|rb|rs|java|kt|swift|c|cc|cpp|h|hpp|cs|php|sh|vue|svelte|scala|ex|exs|lua|sql|ya?ml|toml|md)$/i;
const MAX_FILE_BYTES = 1024 * 1024;

export async function healthPhase(ws: Workspace, findings: Findings): Promise<{ metrics: PhaseOutput['metrics']; dependencies: PhaseOutput['dependencies'] }> {
  const markers: Record<string, number> = { TODO: 0, FIXME: 0, HACK: 0, XXX: 0 };
  const byFile: Record<string, number> = {};
  for (const rel of ws.files.filter((f) => TEXT_SOURCE.test(f))) {
    const text = await readText(ws.root, rel, MAX_FILE_BYTES);
    if (text === null || !/TODO|FIXME|HACK|XXX/.test(text)) continue;
    const lines = text.split('\n');
    for (let i = 0; i < lines.length; i++) {
      const m = MARKER.exec(lines[i]!);
      if (!m) continue;
      markers[m[1]!]!++;
      byFile[rel] = (byFile[rel] ?? 0) + 1;
      // a comment's words are quoted: a token in them is not
      const words = m[2]!.trim();
      findings.add(`marker-${m[1]!.toLowerCase()}`, m[1] === 'TODO' ? 'info' : 'low', rel, i + 1, `${m[1]}: ${words && (await masked(words))}`.trim());
    }
  }
  const manifest = await readJson<Manifest>(ws, 'package.json');
  const deps = manifest && manifest !== 'invalid' ? declared(manifest) : new Map<string, string>();
  const lock = deps.size ? await npmLock(ws) : null;
  return {
    metrics: {
      markers,
      files_with_markers: Object.keys(byFile).length,
      most_markers: Object.entries(byFile)
        .sort((a, b) => b[1] - a[1])
        .slice(0, 10)
        .map(([file, count]) => ({ file, count })),
    },
    dependencies: [...deps].map(([name, range]) => ({ name, range, locked: lock?.packages.get(name)?.version ?? null })),
  };
}
