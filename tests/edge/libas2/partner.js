// A real AS2 partner for SEMQ's interop tests, on libas2 (npm). Two modes:
//   node partner.js server CONFIG.json   -- receives one AS2 message after another on
//        127.0.0.1:PORT, writes each document to OUTDIR, answers a signed MDN;
//        prints "listening PORT" when ready.
//   node partner.js client CONFIG.json FILE -- sends FILE to SEMQ's edge listener, reads
//        the synchronous MDN, prints one JSON line: what it found in it.
// CONFIG: {port, outdir, url, hostId, hostCert, hostKey, partnerId, partnerCert,
//          sign, encrypt, mdnSigned}
'use strict'
const fs = require('fs')
const http = require('http')
const path = require('path')
const pkijs = require('pkijs')
const { AS2Composer, AS2Parser, AS2Disposition, AS2MimeNode } = require('libas2')

// libas2 0.8.2 takes the signing algorithm from the certificate's public-key OID;
// for an RSA key that is rsaEncryption, which pkijs maps to RSAES-PKCS1-v1_5 (an
// encryption scheme) and then refuses to sign with. Map it to the signature scheme
// (what OpenSSL and every S/MIME signer do for rsaEncryption keys).
const byOid = pkijs.CryptoEngine.prototype.getAlgorithmByOID
pkijs.CryptoEngine.prototype.getAlgorithmByOID = function (oid, ...rest) {
  if (oid === '1.2.840.113549.1.1.1') return { name: 'RSASSA-PKCS1-v1_5', hash: { name: 'SHA-256' } }
  return byOid.call(this, oid, ...rest)
}

const cfg = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'))
const read = (p) => fs.readFileSync(p, 'utf8')
const agreement = {
  host: { name: cfg.hostId, id: cfg.hostId, url: 'http://127.0.0.1/', certificate: read(cfg.hostCert),
    privateKey: read(cfg.hostKey), decrypt: cfg.encrypt !== false, sign: cfg.sign === false ? false : 'sha-256',
    mdn: { async: false, signing: cfg.mdnSigned === false ? false : 'sha-256' } },
  partner: { name: cfg.partnerId, id: cfg.partnerId, url: cfg.url || 'http://127.0.0.1/', file: 'EDIFACT',
    certificate: read(cfg.partnerCert), encrypt: cfg.encrypt === false ? false : 'aes256-CBC',
    verify: cfg.sign !== false, mdn: { async: false, signing: cfg.mdnSigned === false ? false : 'sha-256' } }
}

function collect (stream) {
  return new Promise((resolve, reject) => {
    const chunks = []
    stream.on('data', (c) => chunks.push(c))
    stream.on('end', () => resolve(Buffer.concat(chunks)))
    stream.on('error', reject)
  })
}

async function serve () {
  let n = 0
  const server = http.createServer(async (req, res) => {
    try {
      const body = await collect(req)
      const node = await AS2Parser.parse({ headers: req.rawHeaders, content: body })
      const { contentNode, dispositionNode, disposition } = await AS2Disposition.outgoing({ node, agreement })
      const ok = disposition.notification.disposition.processed
      if (ok && contentNode) {
        n += 1
        const content = contentNode.content
        fs.writeFileSync(path.join(cfg.outdir, `doc-${n}.bin`), Buffer.from(content))
        fs.writeFileSync(path.join(cfg.outdir, `doc-${n}.json`), JSON.stringify({
          messageId: node.messageId(), from: node.getHeader('As2-From'),
          mic: disposition.notification.receivedContentMic }))
      }
      const out = await dispositionNode.buildObject()
      res.writeHead(200, out.headers)
      res.end(out.body)
    } catch (e) {
      res.writeHead(500, { 'content-type': 'text/plain' })
      res.end(String(e && e.stack))
    }
  })
  server.listen(cfg.port, '127.0.0.1', () => console.log(`listening ${server.address().port}`))
}

async function send (file) {
  const composer = new AS2Composer({
    message: { filename: path.basename(file), contentType: 'application/edifact',
      content: fs.readFileSync(file),
      sign: cfg.sign === false ? undefined : { cert: read(cfg.hostCert), key: read(cfg.hostKey), algorithm: 'sha-256' },
      encrypt: cfg.encrypt === false ? undefined : { cert: read(cfg.partnerCert), encryption: 'aes256-CBC' } },
    agreement
  })
  const opts = await composer.toRequestOptions(cfg.url)
  const url = new URL(cfg.url)
  const answer = await new Promise((resolve, reject) => {
    const req = http.request({ hostname: url.hostname, port: url.port, path: url.pathname, method: 'POST',
      headers: opts.headers }, async (res) => resolve({ status: res.statusCode, headers: res.rawHeaders,
      body: await collect(res) }))
    req.on('error', reject)
    req.end(opts.body)
  })
  const result = { status: answer.status, messageId: composer.message.messageId() }
  if (answer.status === 200) {
    const mdn = await AS2Parser.parse({ headers: answer.headers, content: answer.body })
    let verified = null
    try { verified = Boolean(await mdn.verify({ cert: read(cfg.partnerCert) })) } catch (e) { verified = `error: ${e.message}` }
    // (libas2 0.8.2's own verification is not trusted here: the test checks the MDN with OpenSSL too)
    const raw = answer.body.toString('latin1')
    result.verifiedByLibas2 = verified
    result.mdn = raw
    result.contentType = mdn.getHeader('Content-Type')
  } else {
    result.body = answer.body.toString('utf8')
  }
  console.log(JSON.stringify(result))
}

if (process.argv[2] === 'server') serve()
else send(process.argv[4]).catch((e) => { console.error(e && e.stack); process.exit(1) })
