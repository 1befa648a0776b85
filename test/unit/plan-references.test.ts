// What a plan step's arguments and `if` read: the run's inputs and earlier steps' outputs.
import { expect } from 'chai';
import { holds, interpolate, STEP_ARGS_MAX_BYTES } from '../../engine/runs/programs.js';

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

  it('reads only what a value holds itself, never what it inherits', () => {
    expect(interpolate('${steps.constructor}', scope)).to.equal('');
    expect(interpolate('[${inputs.__proto__}]', scope)).to.equal('[]');
    expect(interpolate('${inputs.event.toString|inputs.event.ref}', scope)).to.equal('refs/heads/main');
    expect(interpolate('${steps.checkout.output.files.hasOwnProperty}', scope)).to.equal('');
    expect(holds('${inputs.constructor.name}', scope)).to.equal(false);
    // what the value holds itself, a field named like an inherited one included, is read as before
    const own = JSON.parse('{"inputs": {"__proto__": {"x": 1}, "constructor": "mine"}}') as Record<string, unknown>;
    expect(interpolate('${inputs.__proto__.x} ${inputs.constructor}', own)).to.equal('1 mine');
    expect(interpolate('${inputs.x}', own)).to.equal('');
    expect(interpolate('${steps.checkout.output.files.1}', scope)).to.equal('b');
  });

  it('refuses arguments that would be more than 1 MB of JSON before making them, and keeps what fits as it was', () => {
    const args = { path: 'a.txt', content: '${inputs.x}' };
    // {"path":"a.txt","content":"…"}: 29 bytes besides x
    const fits = { inputs: { x: 'é'.repeat((STEP_ARGS_MAX_BYTES - 30) / 2) + 'a' } };
    const made = interpolate(args, fits) as Record<string, unknown>;
    expect(made).to.deep.equal({ path: 'a.txt', content: fits.inputs.x });
    expect(Buffer.byteLength(JSON.stringify(made))).to.equal(STEP_ARGS_MAX_BYTES);
    const over = { inputs: { x: fits.inputs.x + 'a' } };
    expect(() => interpolate(args, over))
      .to.throw('1048576 bytes')
      .with.property('code', 'args-too-large');
    // many references to a large input: refused once the room is used up, not after making it all
    const many = { inputs: { x: 'x'.repeat(50_000) } };
    expect(interpolate({ content: '${inputs.x}'.repeat(20) }, many))
      .to.have.property('content')
      .with.length(1_000_000);
    expect(() => interpolate({ content: '${inputs.x}'.repeat(400) }, many))
      .to.throw()
      .with.property('code', 'args-too-large');
    expect(() => interpolate({ a: Array.from({ length: 400 }, () => '${inputs.x}') }, many))
      .to.throw()
      .with.property('code', 'args-too-large');
    // a lone reference brings its value whole (an object, too): its JSON counts
    const big = { inputs: { list: Array.from({ length: 100_000 }, (_, i) => i) } };
    expect(interpolate({ a: '${inputs.list}' }, big))
      .to.have.property('a')
      .that.equals(big.inputs.list);
    expect(() => interpolate({ a: '${inputs.list}', b: '${inputs.list}' }, big))
      .to.throw()
      .with.property('code', 'args-too-large');
    expect(() => holds('${inputs.x}'.repeat(30), many))
      .to.throw()
      .with.property('code', 'args-too-large');
  });
});
