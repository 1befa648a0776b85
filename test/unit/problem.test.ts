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

  it('answers a store that cannot write now (a full disk) 503 with Retry-After, not 500', () => {
    const full = storeUnavailable(Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' }));
    expect(full?.retryAfterSeconds).to.equal(5);
    expect(toProblem(full, 'r', '/')).to.include({ status: 503, code: 'unavailable' });
    expect(storeUnavailable(Object.assign(new Error('x'), { code: 'SQLITE_IOERR_WRITE' }))).to.not.equal(null);
    expect(storeUnavailable(Object.assign(new Error('x'), { code: 'SQLITE_CONSTRAINT_UNIQUE' })), 'a bug stays a 500').to.equal(null);
    expect(storeUnavailable(new Error('x'))).to.equal(null);
  });
});
