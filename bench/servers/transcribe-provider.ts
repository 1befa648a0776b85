// A scripted OpenAI-compatible transcription provider for the voice benchmark: it parses the multipart
// upload as a real one would (reading every byte of the file) and answers at once, so what is measured
// is the path to it, not speech recognition.
import http from 'node:http';
import busboy from 'busboy';

const answer = JSON.stringify({
  task: 'transcribe',
  language: 'english',
  duration: 1,
  text: 'run the tests',
  segments: [{ start: 0, end: 1, text: 'run the tests' }],
});

const server = http.createServer((req, res) => {
  if (req.method !== 'POST' || req.url !== '/v1/audio/transcriptions') {
    res.writeHead(404).end();
    return;
  }
  let bytes = 0;
  const bb = busboy({ headers: req.headers });
  bb.on('file', (_name, file) => file.on('data', (c: Buffer) => (bytes += c.length)));
  bb.on('close', () => {
    res.writeHead(bytes ? 200 : 400, { 'content-type': 'application/json' }).end(bytes ? answer : '{"error":{"message":"no file"}}');
  });
  req.pipe(bb);
});
server.listen(0, '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`listening on http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
