// What a plan step's arguments and `if` read: the run's inputs and earlier steps' outputs.
import { expect } from 'chai';
import { holds, interpolate } from '../../engine/runs/programs.js';

const scope = {
  inputs: { event: { ref: 'refs/heads/main', number: 7, pull_request: { head: { sha: 'abc' } }, empty: '' } },
  steps: { '0': { output: { done: true, task_id: 'tsk_1' } }, checkout: { output: { head_sha: 'abc', files: ['a', 'b'] } }, skipped: { output: null } },
};

describe('plan references', () => {
  it('puts values into text, keeps a lone reference’s type, and takes the first set of alternatives', () => {
    expect(interpolate('PR #${inputs.event.number} at ${steps.checkout.output.head_sha}', scope)).to.equal('PR #7 at abc');
    expect(interpolate('${inputs.event.number}', scope)).to.equal(7);
    expect(interpolate('${steps.checkout.output.files}', scope)).to.deep.equal(['a', 'b']);
    expect(interpolate('files: ${steps.checkout.output.files}', scope)).to.equal('files: ["a","b"]');
    expect(interpolate('${inputs.event.missing|inputs.event.empty|inputs.event.ref}', scope)).to.equal('refs/heads/main');
    expect(interpolate('${inputs.nothing}', scope)).to.equal('');
    expect(interpolate({ a: ['${steps.0.output.task_id}'] }, scope)).to.deep.equal({ a: ['tsk_1'] });
  });

  it('holds a value that is set and not false, 0 or null, and compares text with == and !=', () => {
    expect(holds('${steps.0.output.done}', scope)).to.equal(true);
    expect(holds('${steps.skipped.output.done}', scope)).to.equal(false);
    expect(holds('${inputs.event.empty}', scope)).to.equal(false);
    expect(holds('${inputs.event.ref} == refs/heads/main', scope)).to.equal(true);
    expect(holds('${inputs.event.ref} == refs/heads/dev', scope)).to.equal(false);
    expect(holds('${inputs.event.ref} != refs/heads/dev', scope)).to.equal(true);
    expect(holds('${inputs.event.number} == 7', scope)).to.equal(true);
    // an empty side is text too: a missing value equals nothing but the empty text
    expect(holds('${inputs.nothing} == main', scope)).to.equal(false);
  });
});
