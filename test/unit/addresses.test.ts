// The http tool's address rule: only public unicast addresses, however they are spelt.
import { expect } from 'chai';
import { isPrivateAddress, privateLiteral } from '../../engine/platform/addresses.js';

describe('http tool addresses', () => {
  it('refuses loopback, private, link-local and special ranges in every spelling', () => {
    for (const a of [
      '127.0.0.1',
      '127.1.2.3',
      '0.0.0.0',
      '10.0.0.1',
      '172.16.5.4',
      '192.168.1.1',
      '169.254.169.254',
      '100.64.0.1',
      '224.0.0.1',
      '255.255.255.255',
      '::1',
      '::',
      '::ffff:127.0.0.1',
      '::ffff:7f00:1',
      '0:0:0:0:0:ffff:7f00:1',
      '::127.0.0.1',
      '64:ff9b::7f00:1',
      '64:ff9b::a00:1',
      '2002::1',
      '2002:7f00:1::',
      '2001::1',
      'fe80::1',
      'fc00::1',
      'fd12:3456::1',
      'ff02::1',
      '2001:db8::1',
      'not-an-address',
    ]) {
      expect(isPrivateAddress(a), a).to.equal(true);
    }
  });

  it('lets public addresses through, IPv4 written as IPv6 included', () => {
    for (const a of ['8.8.8.8', '1.1.1.1', '2606:4700:4700::1111', '::ffff:8.8.8.8']) expect(isPrivateAddress(a), a).to.equal(false);
  });

  it('names a URL whose host is a private address, however it is written, for the callers Node gives no lookup for', () => {
    for (const u of [
      'http://127.0.0.1:18999/ok',
      'http://[::1]/',
      'http://[::127.0.0.1]/',
      'http://[::ffff:127.0.0.1]/',
      'http://2130706433/',
      'http://0x7f.1/',
    ])
      expect(privateLiteral(new URL(u)), u).to.be.a('string');
    for (const u of ['https://example.com/hook', 'https://93.184.216.34/', 'http://[2606:4700::1111]/']) expect(privateLiteral(new URL(u)), u).to.equal(null);
  });
});
