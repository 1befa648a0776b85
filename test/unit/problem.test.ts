import { expect } from 'chai';
import { storeUnavailable, toProblem } from '../../api/problem.js';
import { ConflictError, NotFoundError, ValidationError } from '../../engine/platform/errors.js';

describe('api/problem', () => {
  it('maps engine errors to their status and stable code', () => {
    expect(toProblem(new NotFoundError('gone'), 'r1', '/x')).to.include({ status: 404, code: 'not-found', detail: 'gone', request_id: 'r1', instance: '/x' });
    expect(toProblem(new ConflictError('archived'), 'r1', '/x')).to.include({ status: 409, code: 'conflict' });
    const v = toProblem(new ValidationError('bad', [{ path: '/body/a', message: 'no' }]), 'r1', '/x');
    expect(v).to.include({ status: 400, code: 'validation-failed' });
    expect(v.errors).to.deep.equal([{ path: '/body/a', message: 'no' }]);
  });

  it('shows nothing of an unknown error', () => {
    const p = toProblem(new Error('password=hunter2 at db.ts:12'), 'r1', '/x');
    expect(p).to.include({ status: 500, code: 'internal' });
    expect(JSON.stringify(p)).not.to.contain('hunter2');
  });

  it('maps body-parser and validator errors', () => {
    expect(toProblem(Object.assign(new Error('x'), { type: 'entity.parse.failed', status: 400 }), 'r', '/').code).to.equal('malformed-json');
    expect(toProblem(Object.assign(new Error('x'), { type: 'entity.too.large', status: 413 }), 'r', '/').status).to.equal(413);
    const v = toProblem(
      Object.assign(new Error('x'), {
        status: 400,
        errors: [
          { path: '.body.name', message: 'required' },
          { path: '.body.name', message: 'required' },
        ],
      }),
      'r',
      '/',
    );
    expect(v).to.include({ code: 'bad-request' });
    expect(v.errors).to.deep.equal([{ path: '/body/name', message: 'required' }]);
  });

  it('lists the first 50 errors and counts the rest, from the validator or our own', () => {
    const many = Array.from({ length: 50_001 }, (_, i) => ({ path: `.body.steps.${i}`, message: 'must be object' }));
    const v = toProblem(Object.assign(new Error('x'), { status: 400, errors: many }), 'r', '/');
    expect(v.errors).to.have.length(50);
    expect(v.errors![49]).to.deep.equal({ path: '/body/steps/49', message: 'must be object' });
    expect(v.errors_omitted).to.equal(49_951);
    expect(v.detail).to.match(/^\/body\/steps\/0 must be object; .*\/body\/steps\/49 must be object; and 49951 more$/);
    expect(JSON.stringify(v).length).to.be.below(10_000);
    const own = toProblem(new ValidationError('bad', many.slice(0, 51)), 'r', '/');
    expect(own).to.include({ errors_omitted: 1 });
    // our own error's message joined every error (a DAG's 46,000): its detail is the listed ones too
    const joined = toProblem(new ValidationError(many.map((e) => `${e.path}: ${e.message}`).join('; '), many), 'r', '/');
    expect(joined.detail).to.match(/^\.body\.steps\.0 must be object; .*\.body\.steps\.49 must be object; and 49951 more$/);
    expect(JSON.stringify(joined).length).to.be.below(10_000);
    expect(toProblem(new ValidationError('bad', many.slice(0, 50)), 'r', '/').detail, 'fifty or fewer: its message').to.equal('bad');
    expect(own.errors).to.have.length(50);
    const few = toProblem(new ValidationError('bad', many.slice(0, 50)), 'r', '/');
    expect(few.errors).to.have.length(50);
    expect(few).not.to.have.property('errors_omitted');
  });

  it('answers a store that cannot write now (a full disk) 503 with Retry-After, not 500', () => {
    const full = storeUnavailable(Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' }));
    expect(full?.retryAfterSeconds).to.equal(5);
    expect(toProblem(full, 'r', '/')).to.include({ status: 503, code: 'unavailable' });
    expect(storeUnavailable(Object.assign(new Error('x'), { code: 'SQLITE_IOERR_WRITE' }))).to.not.equal(null);
    expect(storeUnavailable(Object.assign(new Error('x'), { code: 'SQLITE_CONSTRAINT_UNIQUE' })), 'a bug stays a 500').to.equal(null);
    expect(storeUnavailable(new Error('x'))).to.equal(null);
  });
});
