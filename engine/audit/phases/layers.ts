// Layering rules: named layers (a regular expression on paths relative to the root) and the layers
// each may import. From the request, or the workspace's audit-layers.json (data, never code).
import safeRegex from 'safe-regex';
import type { AuditLayer } from '../../platform/index.js';

/** The longest path pattern a layer may have. */
const PATTERN_MAX = 500;

export const LAYERS_FILE = 'audit-layers.json';

/** The layers of a request or a layers file; throws with what is wrong. */
export function parseLayers(value: unknown): AuditLayer[] {
  const list = (value as { layers?: unknown })?.layers ?? value;
  if (!Array.isArray(list)) throw new Error('expected {"layers": [{"name", "path", "may_import"}]}');
  return list.map((l, i) => {
    const layer = l as Partial<AuditLayer>;
    if (typeof layer.name !== 'string' || typeof layer.path !== 'string') throw new Error(`layer ${i}: expected a name and a path (a regular expression)`);
    new RegExp(layer.path);
    // a pattern that can backtrack for ever (a repeated group that repeats: ^(a+)+$) would hold an audit
    // slot, which every tenant's audits share, for as long as the phase may run
    if (layer.path.length > PATTERN_MAX || !safeRegex(layer.path))
      throw new Error(`layer ${layer.name}: its path may take exponential time to match (a repetition inside a repetition); write it without one`);
    const mayImport = layer.may_import ?? [];
    if (!Array.isArray(mayImport) || !mayImport.every((n) => typeof n === 'string'))
      throw new Error(`layer ${layer.name}: may_import must be a list of layer names`);
    return { name: layer.name, path: layer.path, may_import: mayImport };
  });
}
