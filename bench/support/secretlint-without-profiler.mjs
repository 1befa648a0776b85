// Preloaded into the secretlint CLI of the audit benchmark's baseline (node --import): the same fix the
// service applies (engine/audit/phases/security.ts), so the baseline is secretlint without its O(n^2)
// profiler (secretlint#1653), not a strawman.
import { secretLintProfiler } from '@secretlint/profiler';

secretLintProfiler.mark = () => {};
