// A credential masked wherever a provider's answer, or a tool's output, gives it back: in a reason, an error, a
// step's output. Shared by the connections' reasons and the tools that run with a credential (a checkout).

/** The shortest piece of a credential that is masked wherever it appears. */
const PART = 12;

/** A run of base64 long enough to carry a credential (12 characters encode to 16). */
const BASE64_RUN = /[A-Za-z0-9+/]{16,}={0,2}/g;

/**
 * `text` with the credential masked wherever it appears: as it is, with its whitespace folded (a credential with a
 * newline in it), any part of it long enough to tell (12 characters), and encoded as the service sends it (HTTP
 * Basic's `x-access-token:<token>`, SMTP AUTH PLAIN's `\0user\0password`): a run of base64 whose text holds it, or
 * a part of it, is masked whole. A provider that echoes what it was sent (a git host's error, an SMTP server's 535)
 * gave the credential back in base64, which the plain forms did not catch.
 */
export function maskCredential(text: string, secret: string): string {
  if (!secret) return text;
  const forms = [...new Set([secret, secret.replace(/\s+/g, ' ').trim()])];
  const parts = forms.flatMap((form) => Array.from({ length: Math.max(0, form.length - PART + 1) }, (_, i) => form.slice(i, i + PART)));
  let masked = text;
  for (const piece of [...forms, ...parts]) masked = masked.split(piece).join('[credential]');
  const holds = (decoded: string) => forms.some((f) => decoded.includes(f)) || parts.some((p) => decoded.includes(p));
  masked = masked.replace(BASE64_RUN, (run) => (holds(Buffer.from(run, 'base64').toString('latin1')) ? '[credential]' : run));
  // a short credential's base64 is shorter than BASE64_RUN (AUTH LOGIN's password line alone): its own characters
  const cores = forms.flatMap(base64Cores);
  return cores.length ? masked.replace(ANY_BASE64_RUN, (run) => (cores.some((c) => run.includes(c)) ? '[credential]' : run)) : masked;
}

/** Any run of base64, standard or url-safe. */
const ANY_BASE64_RUN = /[A-Za-z0-9+/_-]+={0,2}/g;
/** The fewest characters of a credential's base64 that are told apart from any other text's. */
const CORE_MIN = 6;

/**
 * The base64 characters that `secret` alone decides, wherever it sits in what is encoded: at each of the three
 * places it can start in a group of three bytes (`\0user\0pass`, `user:pass`, the password alone), standard and
 * url-safe. The first characters of a group it starts within and the last of the group it ends within also hold
 * what comes before and after, so they are left out; what is left appears in any encoding that holds the secret.
 */
function base64Cores(secret: string): string[] {
  const bytes = Buffer.from(secret, 'utf8');
  const cores: string[] = [];
  for (const lead of [0, 1, 2]) {
    const encoded = Buffer.concat([Buffer.alloc(lead), bytes, Buffer.alloc(2)]).toString('base64');
    // characters of whole bytes of the secret: from the first that holds no byte before it, to the last that holds none after
    const from = lead === 0 ? 0 : lead + 1;
    const to = Math.floor(((lead + bytes.length) * 8) / 6);
    const core = encoded.slice(from, to);
    if (core.length >= CORE_MIN) cores.push(core, core.replace(/\+/g, '-').replace(/\//g, '_'));
  }
  return [...new Set(cores)];
}
