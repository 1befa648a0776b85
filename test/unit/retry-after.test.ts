// What a model endpoint's answer asks the agent to wait before its next try.
import { expect } from 'chai';
import { retryAfterMs } from '../../engine/runs/agent.js';

describe('retryAfterMs', () => {
  const ask = (h: Record<string, string>, now = 0) => retryAfterMs(new Headers(h), now);

  it('reads seconds, milliseconds (which come first) and an HTTP date, a date already past as no wait', () => {
    expect(ask({ 'retry-after': '2' })).to.equal(2000);
    expect(ask({ 'retry-after': ' 1.5 ' })).to.equal(1500);
    expect(ask({ 'retry-after-ms': '250', 'retry-after': '9' })).to.equal(250);
    expect(ask({ 'retry-after-ms': '0', 'retry-after': '9' })).to.equal(0);
    const at = Date.parse('Wed, 21 Oct 2026 07:28:00 GMT');
    expect(ask({ 'retry-after': 'Wed, 21 Oct 2026 07:28:00 GMT' }, at - 3000)).to.equal(3000);
    expect(ask({ 'retry-after': 'Wed, 21 Oct 2026 07:28:00 GMT' }, at + 3000)).to.equal(0);
  });

  it('reads none from what is not a number of zero or more nor a date', () => {
    for (const v of ['soon', '-5', '1e3', '0x10', '', 'NaN', 'Infinity']) expect(ask({ 'retry-after': v }), v).to.equal(null);
    expect(ask({ 'retry-after-ms': '-1' })).to.equal(null);
    expect(ask({})).to.equal(null);
  });
});
