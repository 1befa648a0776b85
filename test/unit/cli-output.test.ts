// The command-line tool's output (cli/output.ts) and an audit's exit code: colour is decided for stdout and stderr each, so a
// redirected stream gets plain text while the other, at a terminal, keeps its colour.
import { expect } from 'chai';
import { outputOf, terminalSafe } from '../../cli/output.js';
import { auditExitCode, withoutOptionValues } from '../../cli/program.js';

/** A stream that keeps what is written to it; a terminal or not. */
const stream = (isTTY: boolean) => {
  const written: string[] = [];
  return { written, stream: { isTTY, write: (s: string) => written.push(s) } as unknown as NodeJS.WriteStream };
};
const ESC = '\u001b[';

describe('the command-line tool’s output', () => {
  it('paints stderr only when stderr is a terminal, whatever stdout is', () => {
    for (const [outTTY, errTTY] of [
      [true, false],
      [false, true],
    ]) {
      const out = stream(outTTY!);
      const err = stream(errTTY!);
      const o = outputOf({ json: false, noColor: false, stdout: out.stream, stderr: err.stream });
      o.out(o.paint('green', 'ok\n'));
      o.err('reconnecting\n', 'dim');
      expect(out.written.join('').includes(ESC), `stdout ${outTTY ? 'at' : 'not at'} a terminal`).to.equal(outTTY);
      expect(err.written.join('').includes(ESC), `stderr ${errTTY ? 'at' : 'not at'} a terminal`).to.equal(errTTY);
      expect(err.written.join('')).to.contain('reconnecting\n');
    }
  });

  it('shows a table cell’s control characters as escapes: a label cannot erase or redraw another row', () => {
    const out = stream(true);
    const o = outputOf({ json: false, noColor: false, stdout: out.stream, stderr: stream(false).stream });
    o.table(
      [{ id: 'key_1', label: 'bot\u001b[2K\r\u001b[31mkey_0 revoked\u001b[0m\nkey_fake\u009b' }],
      [
        ['ID', (r) => r.id],
        ['LABEL', (r) => r.label],
      ],
    );
    const text = out.written.join('');
    expect(text).not.to.match(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
    expect(text.trimEnd().split('\n')).to.have.length(2);
    expect(text).to.contain('bot\\u001b[2K\\u000d\\u001b[31mkey_0 revoked\\u001b[0m\\u000akey_fake\\u009b');
  });

  it('keeps a step’s colours and drops every other escape sequence and control character of it', () => {
    const output = [
      `${ESC}31mred${ESC}0m ${ESC}38;2;255;0;0mtrue${ESC}m`, // kept: colour only
      '\u001b]0;a title\u0007', // a window title
      '\u001b]8;;https://evil.example\u001b\\a link\u001b]8;;\u001b\\', // a link (its text stays)
      `${ESC}2J${ESC}H${ESC}1A${ESC}2K${ESC}?25l${ESC}6n`, // erase, move, hide the cursor, ask for its place
      '\u001bc\u001b7\u001b8\u001b(B', // reset, save and restore the cursor, a character set
      '\u001bPq#0;2\u001b\\', // a device control string
      '\u009b2J\u009d0;t\u0007', // the same in 8-bit form
      'bell\u0007 back\b nul\u0000 del\u007f',
      'tab\tcr\r\n',
      'cut \u001b]0;the title goes on in the next chunk',
    ].join('');
    expect(terminalSafe(output)).to.equal(`${ESC}31mred${ESC}0m ${ESC}38;2;255;0;0mtrue${ESC}ma linkbell back nul deltab\tcr\r\ncut `);
  });

  it('paints nothing with NO_COLOR', () => {
    const out = stream(true);
    const err = stream(true);
    const o = outputOf({ json: false, noColor: true, stdout: out.stream, stderr: err.stream });
    o.out(o.paint('green', 'ok\n'));
    o.err('reconnecting\n', 'dim');
    expect([...out.written, ...err.written]).to.deep.equal(['ok\n', 'reconnecting\n']);
  });
});

describe('cli/program auditExitCode', () => {
  const phase = (p: string, status: string, counts: Record<string, number> = {}) => ({ phase: p, status, counts });
  it('exits 1 for a finding at --fail-on or worse, 3 when a phase timed out, 1 when one failed, else 0', () => {
    expect(auditExitCode([phase('security', 'completed', { high: 1 })], 'high')).to.deep.equal({ code: 1, unfinished: [] });
    expect(auditExitCode([phase('security', 'completed', { low: 4 })], 'high').code).to.equal(0);
    // a phase that timed out or failed found nothing because it audited nothing: not a pass
    const partial = [phase('security', 'timed_out'), phase('sanity', 'completed'), phase('health', 'failed')];
    expect(auditExitCode(partial, 'low')).to.deep.equal({ code: 3, unfinished: ['security (timed_out)', 'health (failed)'] });
    expect(auditExitCode([phase('health', 'failed')]).code).to.equal(1);
    expect(auditExitCode([phase('security', 'timed_out', { critical: 1 }), phase('sanity', 'completed', { critical: 1 })], 'critical').code).to.equal(1);
    expect(auditExitCode([phase('sanity', 'completed')]).code).to.equal(0);
  });
});

describe('cli/program withoutOptionValues', () => {
  it('drops the value given with an unknown option: a mistyped --key reaches the CI log without its key', () => {
    expect(withoutOptionValues("error: unknown option '--kye=sk_live_SECRET123'\n")).to.equal("error: unknown option '--kye=...'\n");
    expect(withoutOptionValues("error: unknown option '-ksk_live_SECRET123'\n")).to.equal("error: unknown option '-k...'\n");
    expect(withoutOptionValues("error: unknown option '--bogus'\n(Did you mean --json?)\n")).to.equal(
      "error: unknown option '--bogus'\n(Did you mean --json?)\n",
    );
    expect(withoutOptionValues("error: unknown option '-k'\n")).to.equal("error: unknown option '-k'\n");
  });
});
