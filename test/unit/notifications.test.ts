import { expect } from 'chai';
import { notifyBusyWaitMs } from '../../engine/connections/index.js';

describe('notifications: a delivery whose tenant is busy', () => {
  it('asks again after 1 s, then 2, 4, 8 and at most 16 s: a backlog asks less and less often', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 50].map(notifyBusyWaitMs)).to.deep.equal([1000, 1000, 2000, 4000, 8000, 16000, 16000, 16000]);
  });
});
