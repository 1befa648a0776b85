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
  return masked.replace(BASE64_RUN, (run) => (holds(Buffer.from(run, 'base64').toString('latin1')) ? '[credential]' : run));
}
