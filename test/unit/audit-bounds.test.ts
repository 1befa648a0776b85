// What a phase's result may quote of the workspace (engine/audit/phases/bounds.ts): texts cut by the bytes they
// take in the JSON the phase prints, never in the middle of a character, and maps of metrics kept to their largest.
import { expect } from 'chai';
import { boundedMetrics, cutText, ENTRIES_MAX } from '../../engine/audit/phases/bounds.js';

describe('audit bounds', () => {
  it('cuts a text at the bytes its JSON takes, says how much was left out, and leaves a short one as it is', () => {
    expect(cutText('short', 10)).to.equal('short');
    expect(cutText('a'.repeat(30), 10)).to.equal(`${'a'.repeat(10)}… (cut: 20 more characters)`);
    // a control character is six bytes as JSON, a quote two, an emoji four (never cut in two)
    expect(cutText('\u0001\u0001x', 10)).to.equal('\u0001… (cut: 2 more characters)');
    expect(cutText('"'.repeat(10), 10)).to.equal(`${'"'.repeat(5)}… (cut: 5 more characters)`);
    expect(cutText('😀😀😀', 10)).to.equal('😀😀… (cut: 2 more characters)');
  });

  it('keeps a map of counts at its largest entries with the rest in `other`, and counts keys made equal by the cut together', () => {
    const licenses = Object.fromEntries(Array.from({ length: 150 }, (_, i) => [`L${i}`, i < 10 ? 5 : 1]));
    const kept = boundedMetrics({ licenses }) as { licenses: Record<string, number> };
    expect(Object.keys(kept.licenses)).to.have.length(ENTRIES_MAX + 1);
    expect(kept.licenses.L0).to.equal(5);
    expect(kept.licenses.other).to.equal(50);
    const long = boundedMetrics({ [`${'k'.repeat(300)}a`]: 1, [`${'k'.repeat(300)}b`]: 2 }) as Record<string, number>;
    expect(Object.values(long)).to.deep.equal([3]);
    expect(boundedMetrics({ list: Array.from({ length: 300 }, (_, i) => i), text: 'x'.repeat(2000) })).to.deep.include({
      list: Array.from({ length: ENTRIES_MAX }, (_, i) => i),
    });
  });
});
