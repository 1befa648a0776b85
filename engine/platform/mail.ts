// Mail addresses as inbound mail names them: the one address of a From header, its domain, and whether
// a domain another check vouched for (a DKIM signature's, an SPF-checked envelope sender's) is the
// header's own, as DMARC aligns them.

/**
 * The one address of a From header (`Name <a@b>` or `a@b`), lower-cased; null when it holds anything
 * else (two addresses, a group, no address, or an address with two `@`), so that what is checked is
 * exactly whom a reply would reach.
 */
export function mailAddress(header: string): string | null {
  const trimmed = header.trim();
  const m = /^(?:"[^"]*"|[^<>",@]*)\s*<([^<>\s,;@]+@[^<>\s,;@]+)>$/.exec(trimmed) ?? /^([^<>\s,;"@]+@[^<>\s,;"@]+)$/.exec(trimmed);
  return m ? m[1]!.toLowerCase() : null;
}

/** The domain of an address, lower-cased. */
export const mailDomain = (address: string): string => address.slice(address.lastIndexOf('@') + 1).toLowerCase();

/**
 * Relaxed alignment, as DMARC's without the public suffix list: `vouched` is the From domain, a domain it
 * is under, or one under it (bounces@mail.example.com for a From of example.com); never a bare suffix.
 */
export const alignedDomain = (fromDomain: string, vouched: string): boolean => {
  const d = vouched.toLowerCase().replace(/\.$/, '');
  if (!d.includes('.') || !fromDomain.includes('.')) return false;
  return fromDomain === d || fromDomain.endsWith(`.${d}`) || d.endsWith(`.${fromDomain}`);
};
