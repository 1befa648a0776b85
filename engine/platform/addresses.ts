// Which addresses the service may reach on a tenant's behalf (the http tool, connections' base URLs,
// outbound notification endpoints): only public unicast ones, unless SERVICE_HTTP_ALLOW_PRIVATE=1.
import dns from 'node:dns';
import ipaddr from 'ipaddr.js';
import { AddressNotAllowedError } from './errors.js';

/**
 * Only public unicast addresses may be reached: ipaddr.js's range list (maintained upstream) names every
 * other range (loopback, private, link-local, carrier-grade NAT, NAT64 64:ff9b::/96, 6to4 2002::/16,
 * Teredo, reserved, multicast...). An IPv4 address written as IPv6 (::ffff:a.b.c.d, ::a.b.c.d) is
 * judged as the IPv4 address it carries.
 */
export function isPrivateAddress(address: string): boolean {
  let parsed: ipaddr.IPv4 | ipaddr.IPv6;
  try {
    parsed = ipaddr.parse(address);
  } catch {
    return true; // not an address we can judge: refused
  }
  if (parsed.kind() === 'ipv6') {
    const v6 = parsed as ipaddr.IPv6;
    // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated but still routed by some stacks)
    const compatible = v6.parts.slice(0, 6).every((p) => p === 0) && (v6.parts[6] !== 0 || v6.parts[7]! > 1);
    if (v6.isIPv4MappedAddress() || compatible) parsed = ipaddr.fromByteArray(v6.toByteArray().slice(12));
  }
  return parsed.range() !== 'unicast';
}

/**
 * The URL's host when it is an address (not a name) that may not be reached. Node does not call a
 * lookup function for an address, so guardedLookup alone lets it through: the caller checks this first.
 */
export function privateLiteral(url: URL): string | null {
  const host = url.hostname.replace(/^\[|\]$/g, '');
  return ipaddr.isValid(host) && isPrivateAddress(host) ? host : null;
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | dns.LookupAddress[], family?: number) => void;

/** dns.lookup that fails with EPRIVATE when a name resolves to anything but public unicast addresses. */
export function guardedLookup(hostname: string, options: dns.LookupOptions, callback: LookupCallback): void {
  dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, '');
    const list = addresses as dns.LookupAddress[];
    if (!list.length) return callback(Object.assign(new Error(`${hostname} does not resolve`), { code: 'ENOTFOUND' }), '');
    // which address is not said: the message can reach the tenant, who could map internal names with it
    if (list.some((a) => isPrivateAddress(a.address)))
      return callback(Object.assign(new Error(`${hostname} resolves to a private or loopback address`), { code: 'EPRIVATE' }), '');
    if (options.all) return callback(null, list);
    callback(null, list[0]!.address, list[0]!.family);
  });
}

/**
 * Refuses a URL whose host is, or resolves to, anything but public unicast addresses (unless private
 * ones are allowed). For clients that cannot take guardedLookup at connect time (the providers' SDKs),
 * checked just before each use. A name that does not resolve is refused too: it cannot be checked, and
 * the client's own lookup a moment later could find a private address.
 *
 * Answers the addresses the name was found at, every one checked: a client that looks the name up again
 * itself (git's curl) is to be given these, since its own answer could be another (DNS rebinding). None
 * when nothing was looked up: private addresses are allowed, or the host is an address.
 */
export async function assertPublicHost(url: URL, allowPrivate: boolean): Promise<string[]> {
  if (allowPrivate) return [];
  const literal = privateLiteral(url);
  if (literal) throw new AddressNotAllowedError(`${literal} is a private or loopback address`);
  const host = url.hostname.replace(/^\[|\]$/g, '');
  // no host is no address to check: clients may take it as localhost
  if (!host) throw new AddressNotAllowedError('the URL names no host');
  if (ipaddr.isValid(host)) return [];
  const addresses = await dns.promises.lookup(host, { all: true }).catch((err: NodeJS.ErrnoException) => {
    throw new AddressNotAllowedError(`${host} does not resolve (${err.code ?? 'no answer'}): only a name whose addresses are public is reached`);
  });
  if (!addresses.length) throw new AddressNotAllowedError(`${host} does not resolve: only a name whose addresses are public is reached`);
  // which address is not said: a tenant could map the deployment's internal names with it
  if (addresses.some((a) => isPrivateAddress(a.address))) throw new AddressNotAllowedError(`${host} resolves to a private or loopback address`);
  return addresses.map((a) => a.address);
}
