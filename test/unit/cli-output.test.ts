// The command-line tool's output (cli/output.ts) and an audit's exit code: colour is decided for stdout and stderr each, so a
// redirected stream gets plain text while the other, at a terminal, keeps its colour.
import { expect } from 'chai';
import { outputOf } from '../../cli/output.js';
import { auditExitCode } from '../../cli/program.js';

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
