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

/** visible() for text of several lines: an error's message, whose line breaks are the tool's own. */
export const visibleLines = (text: string): string => text.split('\n').map(visible).join('\n');

// A sequence that only colours (SGR: ESC [ numbers m); every other escape sequence, with the text an OSC, DCS, SOS,
// PM or APC string carries (to its end, or to the end of the text when it has none); any other control character
const SGR = /^\u001b\[[0-9;:]*m$/;
const CONTROL =
  /\u001b\[[\u0030-\u003f]*[\u0020-\u002f]*[\u0040-\u007e]?|\u001b[\u005d\u0050\u0058\u005e\u005f][^\u0007\u001b\u009c]*(?:\u0007|\u001b\\|\u009c)?|\u001b[\u0020-\u002f]*[\u0030-\u007e]?|\u009b[\u0030-\u003f]*[\u0020-\u002f]*[\u0040-\u007e]?|[\u0090\u0098\u009d\u009e\u009f][^\u0007\u001b\u009c]*(?:\u0007|\u001b\\|\u009c)?|[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/g;

/**
 * A step's output as a terminal may show it: a tool's colours kept (ESC[...m), every other escape sequence
 * dropped (a title set, a link, the cursor moved, a line or the screen erased, the terminal asked to answer),
 * with the other control characters but tab, line feed and carriage return (which returns to the start of the
 * tool's own line only: the tool's lines and ours never share one).
 */
export const terminalSafe = (text: string): string => text.replace(CONTROL, (seq) => (SGR.test(seq) ? seq : ''));

export const seconds = (ms: number | null | undefined): string => (ms == null ? '-' : `${(ms / 1000).toFixed(1)} s`);
