// How the command-line tool prints: colour and progress only at a terminal (and never with NO_COLOR),
// decided for stdout and stderr each (`run --wait 2>log`: colour on screen, none in the log), plain
// lines in CI logs; tables for lists; --json prints the service's own JSON instead.
import { styleText } from 'node:util';

type Style = Parameters<typeof styleText>[0];

export type Output = {
  json: boolean;
  tty: boolean;
  out(text: string): void;
  /** A line of the tool's own on stderr, in `style` when stderr is a terminal. */
  err(text: string, style?: Style): void;
  /** `text` in `style` when stdout is a terminal: for what goes to out(). */
  paint(style: Style, text: string): string;
  printJson(value: unknown): void;
  table(rows: Record<string, unknown>[], columns: [header: string, value: (row: Record<string, any>) => unknown][]): void;
};

export function outputOf(opts: { json: boolean; noColor: boolean; stdout?: NodeJS.WriteStream; stderr?: NodeJS.WriteStream }): Output {
  const stdout = opts.stdout ?? process.stdout;
  const stderr = opts.stderr ?? process.stderr;
  const tty = Boolean(stdout.isTTY);
  const painter =
    (stream: NodeJS.WriteStream) =>
    (style: Style, text: string): string =>
      stream.isTTY && !opts.noColor ? styleText(style, text, { validateStream: false }) : text;
  const paint = painter(stdout);
  const paintErr = painter(stderr);
  return {
    json: opts.json,
    tty,
    out: (text) => void stdout.write(text),
    err: (text, style) => void stderr.write(style ? paintErr(style, text) : text),
    paint,
    printJson: (value) => void stdout.write(`${JSON.stringify(value, null, 2)}\n`),
    table(rows, columns) {
      const cells = [columns.map(([h]) => h), ...rows.map((r) => columns.map(([, v]) => visible(String(v(r) ?? '-'))))];
      const widths = columns.map((_, i) => Math.max(...cells.map((c) => c[i]!.length)));
      for (const line of cells) stdout.write(`${line.map((c, i) => (i === line.length - 1 ? c : c.padEnd(widths[i]!))).join('  ')}\n`);
      if (!rows.length) stdout.write('(none)\n');
    },
  };
}

/** Text the server holds (a label, a name, a title) with its control characters shown as escapes: it cannot
 * move the cursor, erase or recolour another line (a table's cells, a record's fields). */
export const visible = (text: string): string => text.replace(/[\u0000-\u001f\u007f-\u009f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);

export const seconds = (ms: number | null | undefined): string => (ms == null ? '-' : `${(ms / 1000).toFixed(1)} s`);
