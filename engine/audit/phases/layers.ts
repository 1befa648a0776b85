// Layering rules: named layers (a regular expression on paths relative to the root) and the layers
// each may import. From the request, or the workspace's audit-layers.json (data, never code).
import type { AuditLayer } from '../../platform/index.js';

export const LAYERS_FILE = 'audit-layers.json';

/** The layers of a request or a layers file; throws with what is wrong. */
export function parseLayers(value: unknown): AuditLayer[] {
  const list = (value as { layers?: unknown })?.layers ?? value;
  if (!Array.isArray(list)) throw new Error('expected {"layers": [{"name", "path", "may_import"}]}');
  return list.map((l, i) => {
    const layer = l as Partial<AuditLayer>;
    if (typeof layer.name !== 'string' || typeof layer.path !== 'string') throw new Error(`layer ${i}: expected a name and a path (a regular expression)`);
    new RegExp(layer.path);
    const mayImport = layer.may_import ?? [];
    if (!Array.isArray(mayImport) || !mayImport.every((n) => typeof n === 'string'))
      throw new Error(`layer ${layer.name}: may_import must be a list of layer names`);
    return { name: layer.name, path: layer.path, may_import: mayImport };
  });
}
