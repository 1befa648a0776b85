// Layering rules: named layers (a regular expression on paths relative to the root) and the layers
// each may import. From the request, or the workspace's audit-layers.json (data, never code).
import { RE2JS } from 're2js';
import type { AuditLayer } from '../../platform/index.js';

/** The longest path pattern a layer may have. */
const PATTERN_MAX = 500;

export const LAYERS_FILE = 'audit-layers.json';

/** A layer's path pattern, compiled for RE2: `test` finds it anywhere in a path, as RegExp.test did. */
export const layerPattern = (path: string): { test(input: string): boolean } => RE2JS.compile(path);

/** The layers of a request or a layers file; throws with what is wrong. */
export function parseLayers(value: unknown): AuditLayer[] {
  const list = (value as { layers?: unknown })?.layers ?? value;
  if (!Array.isArray(list)) throw new Error('expected {"layers": [{"name", "path", "may_import"}]}');
  return list.map((l, i) => {
    const layer = l as Partial<AuditLayer>;
    if (typeof layer.name !== 'string' || typeof layer.path !== 'string') throw new Error(`layer ${i}: expected a name and a path (a regular expression)`);
    // matched by RE2 (re2js), in time linear in the path: a pattern that would backtrack for ever in
    // JavaScript's engine (^(a|a)*$, which a checker of nested repetitions passed) would hold an audit slot,
    // which every tenant's audits share, for as long as the phase may run. RE2 has no lookaround and no
    // backreferences: such a pattern is refused
    if (layer.path.length > PATTERN_MAX) throw new Error(`layer ${layer.name}: its path is longer than ${PATTERN_MAX} characters`);
    try {
      layerPattern(layer.path);
    } catch (err) {
      throw new Error(`layer ${layer.name}: its path is not a regular expression RE2 takes (${(err as Error).message})`);
    }
    const mayImport = layer.may_import ?? [];
    if (!Array.isArray(mayImport) || !mayImport.every((n) => typeof n === 'string'))
      throw new Error(`layer ${layer.name}: may_import must be a list of layer names`);
    return { name: layer.name, path: layer.path, may_import: mayImport };
  });
}
