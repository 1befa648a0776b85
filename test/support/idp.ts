// A real OpenID Connect provider on loopback for the sign-in tests: oidc-provider with its development
// login and consent pages. Accounts are whatever login name is typed; each one's org_id claim comes from
// the test's table.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Provider from 'oidc-provider';
import { freePort } from './harness.js';

export type Idp = { issuer: string; clientId: string; clientSecret: string; close(): Promise<void> };

export async function startIdp(opts: { redirectUri: string; orgOf: (login: string) => string | undefined; clientId?: string }): Promise<Idp> {
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const clientId = opts.clientId ?? 'automation-service';
  const clientSecret = 'idp-client-secret-0123456789abcdef';
  const provider = new Provider(issuer, {
    clients: [
      { client_id: clientId, client_secret: clientSecret, redirect_uris: [opts.redirectUri], grant_types: ['authorization_code'], response_types: ['code'] },
    ],
    // the scope's claims go in the ID token, which is what the service reads
    conformIdTokenClaims: false,
    claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name', 'org_id'] },
    async findAccount(_ctx, id) {
      return {
        accountId: id,
        async claims() {
          const org = opts.orgOf(id);
          return { sub: id, email: `${id}@example.com`, email_verified: true, name: `User ${id}`, ...(org ? { org_id: org } : {}) };
        },
      };
    },
    cookies: { keys: ['idp-cookie-key-0123456789abcdef'] },
  });
  // the development pages print a warning per start: expected here
  provider.on('server_error', () => undefined);
  const server = http.createServer(provider.callback());
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
  return {
    issuer: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    clientId,
    clientSecret,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}
