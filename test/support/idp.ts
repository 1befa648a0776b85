// A real OpenID Connect provider on loopback for the sign-in tests: oidc-provider with its development
// login and consent pages, and signing keys of the test's own. Accounts are whatever login name is
// typed; each one's org_id claim comes from the test's table. In front of it a small proxy can rewrite
// the ID token the token endpoint answers (re-signed with the provider's own key, so only its claims
// are wrong): what a provider that issues a token for another audience, or an expired one, looks like.
import http from 'node:http';
import { exportJWK, generateKeyPair, SignJWT, decodeJwt, type JWTPayload } from 'jose';
import Provider from 'oidc-provider';
import { freePort } from './harness.js';

export type Idp = {
  issuer: string;
  clientId: string;
  clientSecret: string;
  /** rewrites the claims of the next ID tokens until set back to null */
  tamper: ((claims: JWTPayload) => JWTPayload) | null;
  close(): Promise<void>;
};

const KID = 'test-signing-key';

export async function startIdp(opts: { redirectUri: string; orgOf: (login: string) => string | undefined }): Promise<Idp> {
  const [front, inner] = [await freePort(), await freePort()];
  const issuer = `http://127.0.0.1:${front}`;
  const clientId = 'automation-service';
  const clientSecret = 'idp-client-secret-0123456789abcdef';
  const { privateKey } = await generateKeyPair('RS256', { extractable: true });
  const jwk = { ...(await exportJWK(privateKey)), kid: KID, alg: 'RS256', use: 'sig' };
  const provider = new Provider(issuer, {
    clients: [
      { client_id: clientId, client_secret: clientSecret, redirect_uris: [opts.redirectUri], grant_types: ['authorization_code'], response_types: ['code'] },
    ],
    jwks: { keys: [jwk as never] },
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
  const providerServer = http.createServer(provider.callback());
  await new Promise<void>((r) => providerServer.listen(inner, '127.0.0.1', r));

  const idp: Idp = {
    issuer,
    clientId,
    clientSecret,
    tamper: null,
    close: async () => {
      for (const s of [proxy, providerServer]) {
        s.closeAllConnections();
        await new Promise<void>((r) => s.close(() => r()));
      }
    },
  };
  const proxy = http.createServer((req, res) => {
    const upstream = http.request({ host: '127.0.0.1', port: inner, method: req.method, path: req.url, headers: req.headers }, (answer) => {
      const tamper = idp.tamper;
      if (!tamper || !req.url?.startsWith('/token')) {
        res.writeHead(answer.statusCode!, answer.headers);
        answer.pipe(res);
        return;
      }
      const chunks: Buffer[] = [];
      answer.on('data', (c: Buffer) => chunks.push(c));
      answer.on('end', async () => {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id_token?: string };
        if (body.id_token)
          body.id_token = await new SignJWT(tamper(decodeJwt(body.id_token))).setProtectedHeader({ alg: 'RS256', kid: KID, typ: 'JWT' }).sign(privateKey);
        const text = JSON.stringify(body);
        const { 'content-length': _length, ...headers } = answer.headers;
        res.writeHead(answer.statusCode!, { ...headers, 'content-length': Buffer.byteLength(text) });
        res.end(text);
      });
    });
    req.pipe(upstream);
  });
  await new Promise<void>((r) => proxy.listen(front, '127.0.0.1', r));
  return idp;
}
