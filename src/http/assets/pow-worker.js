// Solves a proof-of-work challenge of the waiting room off the page's main thread: finds a
// decimal nonce such that SHA-256(prefix + nonce) starts with difficulty_bits zero bits.
// Posts {progress: hashes} now and then, and {nonce} once found.
//
// crypto.subtle exists only in secure contexts (https, localhost); a page served over plain
// http from another host falls back to the small SHA-256 below, slower but the same hash.
'use strict';

const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);

// FIPS 180-4 SHA-256 of a byte array; answers the 32-byte digest.
function sha256(bytes) {
  const len = bytes.length;
  const n = ((len + 9 + 63) >> 6) << 6;
  const m = new Uint8Array(n);
  m.set(bytes);
  m[len] = 0x80;
  const dv = new DataView(m.buffer);
  dv.setUint32(n - 8, Math.floor(len / 0x20000000));
  dv.setUint32(n - 4, (len * 8) >>> 0);
  const H = new Uint32Array([
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
  ]);
  const w = new Uint32Array(64);
  const rotr = (x, r) => (x >>> r) | (x << (32 - r));
  for (let o = 0; o < n; o += 64) {
    for (let i = 0; i < 16; i++) w[i] = dv.getUint32(o + 4 * i);
    for (let i = 16; i < 64; i++) {
      const s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >>> 3);
      const s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >>> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1; // a Uint32Array keeps it mod 2^32
    }
    let [a, b, c, d, e, f, g, h] = H;
    for (let i = 0; i < 64; i++) {
      const t1 = (h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    H[0] += a; H[1] += b; H[2] += c; H[3] += d; H[4] += e; H[5] += f; H[6] += g; H[7] += h;
  }
  const out = new Uint8Array(32);
  const ov = new DataView(out.buffer);
  for (let i = 0; i < 8; i++) ov.setUint32(4 * i, H[i]);
  return out;
}

function zeroBits(hash) {
  let n = 0;
  for (const b of hash) {
    if (b === 0) { n += 8; continue; }
    return n + Math.clz32(b) - 24;
  }
  return n;
}

const enc = new TextEncoder();
const subtle = self.crypto && self.crypto.subtle;
const digest = subtle
  ? async (s) => new Uint8Array(await subtle.digest('SHA-256', enc.encode(s)))
  : async (s) => sha256(enc.encode(s));

// Hashes in batches (subtle.digest is asynchronous; a batch keeps it busy), reporting
// progress every few thousand hashes so the page can show that work is happening.
const BATCH = 512;
self.onmessage = async (e) => {
  const { prefix, difficulty_bits: bits } = e.data;
  for (let i = 0; ; i += BATCH) {
    const batch = [];
    for (let j = i; j < i + BATCH; j++) batch.push(digest(prefix + j));
    const hashes = await Promise.all(batch);
    for (let k = 0; k < BATCH; k++) {
      if (zeroBits(hashes[k]) >= bits) { self.postMessage({ nonce: String(i + k) }); return; }
    }
    if ((i / BATCH) % 8 === 7) self.postMessage({ progress: i + BATCH });
  }
};
