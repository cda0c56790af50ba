#!/usr/bin/env python3
"""Writes the payload_fuzzer seed corpus (fuzz/corpus/payload_fuzzer/).

The signed aws-chunked seeds need real chunk signatures, so they are computed here with the same
fixed key, scope and seed signature as payload_fuzzer.cc. Run from anywhere:
    python3 fuzz/make_seeds.py
Layout of each seed: mode byte, read-size byte, "Name: value\\n" header lines, "\\n", body.
"""
import base64
import hashlib
import hmac
import os
import zlib

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DATE, REGION, SERVICE = "20130524", "us-east-1", "s3"
AMZ_DATE = DATE + "T000000Z"
SCOPE = f"{DATE}/{REGION}/{SERVICE}/aws4_request"
SEED_SIGNATURE = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
PLAIN, UNSIGNED, UNSIGNED_TRAILER, SIGNED, SIGNED_TRAILER = range(5)


def hm(key, msg):
    return hmac.new(key, msg.encode() if isinstance(msg, str) else msg, hashlib.sha256).digest()


SIGNING_KEY = hm(hm(hm(hm(("AWS4" + SECRET).encode(), DATE), REGION), SERVICE), "aws4_request")


def seed(mode, read_seed, headers, body):
    head = "".join(f"{k}: {v}\n" for k, v in headers)
    return bytes([mode, read_seed]) + (head + "\n").encode() + body


def unsigned_chunks(chunks, trailers=b""):
    out = b""
    for c in chunks + [b""]:
        out += f"{len(c):x}\r\n".encode() + c + (b"\r\n" if c else b"")
    return out + trailers + b"\r\n"


def signed_chunks(chunks, trailer_lines=None):
    prev, out = SEED_SIGNATURE, b""
    for c in chunks + [b""]:
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", AMZ_DATE, SCOPE, prev, EMPTY_SHA256,
                         hashlib.sha256(c).hexdigest()])
        prev = hmac.new(SIGNING_KEY, sts.encode(), hashlib.sha256).hexdigest()
        out += f"{len(c):x};chunk-signature={prev}\r\n".encode() + c + (b"\r\n" if c else b"")
    if trailer_lines is not None:
        canonical = "".join(f"{k}:{v}\n" for k, v in trailer_lines)
        sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", AMZ_DATE, SCOPE, prev, hashlib.sha256(canonical.encode()).hexdigest()])
        sig = hmac.new(SIGNING_KEY, sts.encode(), hashlib.sha256).hexdigest()
        out += "".join(f"{k}:{v}\r\n" for k, v in trailer_lines).encode()
        out += f"x-amz-trailer-signature:{sig}\r\n".encode()
    return out + b"\r\n"


def crc32_b64(data):
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "payload_fuzzer")
    os.makedirs(out_dir, exist_ok=True)
    body = b"hello, kiln payload\n"
    parts = [b"a" * 17, b"bc" * 9, b"xyz"]
    data = b"".join(parts)
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    seeds = {
        "plain_hash": seed(PLAIN, 7, [], body),
        "plain_hash_md5_crc32": seed(PLAIN, 3, [("x-amz-content-sha256", hashlib.sha256(body).hexdigest()),
                                               ("Content-MD5", md5), ("x-amz-checksum-crc32", crc32_b64(body))], body),
        "plain_hash_mismatch": seed(PLAIN, 1, [("x-amz-content-sha256", "0" * 64)], body),
        "unsigned": seed(UNSIGNED, 200, [], body),
        "unsigned_sha256_checksum": seed(UNSIGNED, 9, [("x-amz-checksum-sha256",
                                                      base64.b64encode(hashlib.sha256(body).digest()).decode())], body),
        "unsigned_trailer_crc32": seed(UNSIGNED_TRAILER, 11, [
            ("x-amz-decoded-content-length", str(len(data))), ("x-amz-trailer", "x-amz-checksum-crc32")],
            unsigned_chunks(parts, f"x-amz-checksum-crc32:{crc32_b64(data)}\r\n".encode())),
        "unsigned_trailer_none": seed(UNSIGNED_TRAILER, 5, [("x-amz-decoded-content-length", str(len(data)))],
                                      unsigned_chunks(parts)),
        "signed_chunks": seed(SIGNED, 13, [("x-amz-decoded-content-length", str(len(data)))], signed_chunks(parts)),
        "signed_chunks_md5": seed(SIGNED, 2, [("x-amz-decoded-content-length", str(len(data))),
                                              ("Content-MD5", base64.b64encode(hashlib.md5(data).digest()).decode())],
                                  signed_chunks(parts)),
        "signed_trailer_crc32": seed(SIGNED_TRAILER, 17, [
            ("x-amz-decoded-content-length", str(len(data))), ("x-amz-trailer", "x-amz-checksum-crc32")],
            signed_chunks(parts, [("x-amz-checksum-crc32", crc32_b64(data))])),
    }
    for name, content in seeds.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(content)


if __name__ == "__main__":
    main()
