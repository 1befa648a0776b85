// A code host 403 that is a rate limit, told from one that refuses the credential by the wait GitHub names.
import { expect } from 'chai';
import { codehostKit } from '../../engine/connections/kits.js';

describe('the code host kit’s reading of a 403', () => {
  // as @octokit/request throws an answer of 400 or more
  const answered = (status: number, headers: Record<string, string>, message = 'API rate limit exceeded') => ({
    name: 'HttpError',
    status,
    response: { status, headers, data: { message } },
  });
  const classify = (status: number, headers: Record<string, string>, message?: string) => codehostKit.classify(answered(status, headers, message), 'tok')!;

  it('takes a 403 with Retry-After, or with no request left until x-ratelimit-reset, for a 429 with that wait', () => {
    expect(classify(403, { 'retry-after': '30' })).to.deep.include({ status: 429, retryAfterSeconds: 30 });
    const reset = String(Math.floor(Date.now() / 1000) + 120);
    const limited = classify(403, { 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': reset });
    expect(limited.status).to.equal(429);
    expect(limited.retryAfterSeconds).to.be.within(119, 120);
    // a 429 that names only the reset waits for it as well
    expect(classify(429, { 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': reset }).retryAfterSeconds).to.be.within(119, 120);
    // a reset already past: ask again now
    expect(classify(403, { 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': '1000' })).to.deep.include({ status: 429, retryAfterSeconds: 0 });
  });

  it('takes a 403 whose message names a secondary rate limit, and no wait, for a 429 of a minute (GitHub: "at least one minute")', () => {
    const message = 'You have exceeded a secondary rate limit and have been temporarily blocked from content creation.';
    expect(classify(403, {}, message)).to.deep.include({ status: 429, retryAfterSeconds: 60 });
    expect(classify(429, {}, message)).to.deep.include({ status: 429, retryAfterSeconds: 60 });
    // the wait it names still goes first
    expect(classify(403, { 'retry-after': '5' }, message)).to.deep.include({ status: 429, retryAfterSeconds: 5 });
  });

  it('keeps a 403 that names no wait, or has requests left, a refusal of the credential', () => {
    const reset = String(Math.floor(Date.now() / 1000) + 120);
    expect(classify(403, {})).to.deep.include({ status: 403, retryAfterSeconds: null });
    expect(classify(403, { 'x-ratelimit-remaining': '4999', 'x-ratelimit-reset': reset })).to.deep.include({ status: 403, retryAfterSeconds: null });
    expect(classify(403, { 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': 'soon' })).to.deep.include({ status: 403, retryAfterSeconds: null });
  });
});
