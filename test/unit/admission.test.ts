// A process's places for work it takes a few of at once: refused at once past the tenant's share (429) and
// past the process's places (503), both with Retry-After; a place is given back however its work ends.
import { expect } from 'chai';
import { admission, RateLimitedError, ServiceUnavailableError } from '../../engine/platform/index.js';

describe('admission: places for work taken a few at once', () => {
  it('refuses a tenant past its share (429) and anyone past the places (503), and gives each place back', async () => {
    const places = admission({ max: 4, tenantShare: 2, what: 'evidence packs', retryAfterSeconds: 2 });
    const release: (() => void)[] = [];
    const held = (tenantId: string) => places.hold(tenantId, () => new Promise<string>((r) => release.push(() => r(tenantId))));
    const running = [held('a'), held('a'), held('b')];
    const third = await places.hold('a', async () => 'ran').catch((e: unknown) => e);
    expect(third).to.be.instanceOf(RateLimitedError);
    expect((third as RateLimitedError).retryAfterSeconds).to.equal(2);
    expect((third as Error).message).to.equal('this tenant has 2 evidence packs in progress, the most it may have at once; try again shortly');
    running.push(held('b'));
    const fifth = await places.hold('c', async () => 'ran').catch((e: unknown) => e);
    expect(fifth).to.be.instanceOf(ServiceUnavailableError);
    expect((fifth as Error).message).to.equal('the service is taking 4 evidence packs already; try again shortly');
    release.forEach((r) => r());
    expect(await Promise.all(running)).to.deep.equal(['a', 'a', 'b', 'b']);
    // a place is given back when its work fails too
    await places.hold('c', async () => Promise.reject(new Error('broke'))).catch(() => undefined);
    const again = await Promise.all(['a', 'a', 'c', 'c'].map((t) => places.hold(t, async () => t)));
    expect(again).to.deep.equal(['a', 'a', 'c', 'c']);
  });
});
