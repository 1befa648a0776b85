// REDIS_URL as the service reads it, and the hash tag a Redis Cluster's prefix needs: apart from the
// connection factory (redis.ts), so the configuration reads them without loading the Redis client.

/**
 * REDIS_URL names one server (`redis://[user:password@]host:port[/db]`) or the nodes of a Redis Cluster,
 * comma-separated in the host part (`redis://[user:password@]host1:port1,host2:port2,host3:port3`); a few
 * nodes are enough, the client finds the rest. `rediss:` means TLS either way.
 */
export type RedisTarget = {
  cluster: boolean;
  nodes: { host: string; port: number }[];
  username?: string;
  password?: string;
  db?: number;
  tls: boolean;
};

export function parseRedisUrl(url: string): RedisTarget {
  // the password runs to the last @ (one written unencoded may hold @), and a host never holds one: no part of a
  // password is ever taken for a host, which errors and logs would name
  const m = /^(rediss?):\/\/(?:([^:@/]*)(?::([^/]*))?@)?([^/?#@]+)(?:\/(\d+))?\/?(?:\?[^#]*)?$/.exec(url.trim());
  if (!m) throw new Error('expected redis://[user:password@]host:port[,host:port...][/db]');
  const [, scheme, user, pass, hosts, db] = m;
  const nodes = hosts!.split(',').map((h) => {
    const hp = /^(\[[^\]]+\]|[^:]+)(?::(\d{1,5}))?$/.exec(h.trim());
    if (!hp) throw new Error(`"${h}" is not host:port`);
    return { host: hp[1]!.replace(/^\[|\]$/g, ''), port: hp[2] ? Number(hp[2]) : 6379 };
  });
  return {
    cluster: nodes.length > 1,
    nodes,
    ...(user ? { username: decodeURIComponent(user) } : {}),
    ...(pass !== undefined ? { password: decodeURIComponent(pass) } : {}),
    ...(db ? { db: Number(db) } : {}),
    tls: scheme === 'rediss',
  };
}

/** On a Redis Cluster every key of a Lua script must live in one slot: the prefix carries a hash tag (`{svc}`). */
export const hasHashTag = (prefix: string): boolean => /\{[^{}]+\}/.test(prefix);
