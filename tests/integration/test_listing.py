"""Listing 2,000 keys: every page of ListObjectsV2 / ListObjects (v1) compared exactly with a
Python model of S3's semantics (UTF-8 binary order, prefix, delimiter grouping, StartAfter,
Marker, MaxKeys, continuation, encoding-type=url)."""

import concurrent.futures
import urllib.parse

import pytest

import kiln_harness as kh

ODD_KEYS = [
    "odd/with space", "odd/plus+sign", "odd/percent%20literal", "odd/100%", "odd/ünïcødé/файл",
    "odd/emoji-\U0001F600", "odd/amp&lt<gt>\"quote'", "odd/tab\tx", "odd//double", "odd/./dot",
    "odd/trailing/", "odd/~tilde", "odd/question?mark", "odd/hash#frag", "odd/semi;colon=eq",
    "odd/back\\slash", "odd/star*", "odd/中文", "odd/%2F-literal", "odd/..", "odd/a=b&c=d",
    "odd/newline\nkey",
]
CTRL_KEYS = ["ctrl/\x01start", "ctrl/mid\x1fdle", "ctrl/plain"]


def build_keys():
    keys = ["top-%04d" % i for i in range(100)]
    keys += ["dir%02d/file-%04d" % (d, i) for d in range(20) for i in range(40)]
    keys += ["deep/%d/x/%03d" % (d, i) for d in range(10) for i in range(40)]
    keys += ["flat/%05d" % i for i in range(600)]
    keys += ODD_KEYS + CTRL_KEYS
    i = 0
    while len(keys) < 2000:
        keys.append("z/%d" % i)
        i += 1
    assert len(set(keys)) == 2000
    return keys


KEYS = build_keys()


def model_page(keys, prefix="", delimiter="", marker="", max_keys=1000):
    """One page: (contents, common_prefixes, truncated, next_marker) where marker is exclusive."""
    ordered = sorted(keys, key=lambda k: k.encode("utf-8"))
    contents, prefixes = [], []
    entries = 0
    last = None
    truncated = False
    for k in ordered:
        if not k.startswith(prefix) or k.encode() <= marker.encode():
            continue
        cp = None
        if delimiter:
            idx = k.find(delimiter, len(prefix))
            if idx >= 0:
                cp = k[:idx + len(delimiter)]
        if cp is not None:
            if cp == last or cp.encode() <= marker.encode():
                continue
        if entries == max_keys:
            truncated = True
            break
        if cp is not None:
            prefixes.append(cp)
            last = cp
        else:
            contents.append(k)
            last = k
        entries += 1
    return contents, prefixes, truncated, last


@pytest.fixture(scope="module")
def listing_bucket(s3):
    name = "listing-2000"
    s3.create_bucket(Bucket=name)

    def put(k):
        s3.put_object(Bucket=name, Key=k, Body=k.encode("utf-8")[:16])

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(put, KEYS))
    return name


def _v2_all_pages(s3, bucket, **kw):
    pages = []
    token = None
    while True:
        args = dict(kw)
        if token:
            args["ContinuationToken"] = token
        page = s3.list_objects_v2(Bucket=bucket, **args)
        pages.append(page)
        if not page["IsTruncated"]:
            return pages
        token = page["NextContinuationToken"]
        assert len(pages) < 1000


def _check_v2(s3, bucket, prefix="", delimiter="", start_after="", max_keys=1000):
    kw = {}
    if prefix:
        kw["Prefix"] = prefix
    if delimiter:
        kw["Delimiter"] = delimiter
    if start_after:
        kw["StartAfter"] = start_after
    if max_keys != 1000:
        kw["MaxKeys"] = max_keys
    pages = _v2_all_pages(s3, bucket, **kw)
    marker = start_after
    all_keys, all_prefixes = [], []
    for i, page in enumerate(pages):
        contents, prefixes, truncated, last = model_page(KEYS, prefix, delimiter, marker, max_keys)
        got_keys = [o["Key"] for o in page.get("Contents", [])]
        got_prefixes = [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        where = "page %d of %r" % (i, kw)
        assert got_keys == contents, where
        assert got_prefixes == prefixes, where
        assert page["KeyCount"] == len(contents) + len(prefixes), where
        assert page["IsTruncated"] == truncated, where
        assert page["MaxKeys"] == max_keys, where
        assert page.get("Prefix", "") == prefix, where
        if delimiter:
            assert page.get("Delimiter") == delimiter, where
        if start_after:
            assert page.get("StartAfter") == start_after, where
        assert ("NextContinuationToken" in page) == truncated, where
        for o in page.get("Contents", []):
            assert o["Size"] == len(o["Key"].encode("utf-8")[:16])
            assert o["StorageClass"] == "STANDARD"
        all_keys += got_keys
        all_prefixes += got_prefixes
        marker = last
    # Whole-listing check independent of page boundaries.
    exp_keys, exp_prefixes, trunc, _ = model_page(KEYS, prefix, delimiter, start_after, 10 ** 9)
    assert not trunc
    assert all_keys == exp_keys
    assert all_prefixes == exp_prefixes
    return pages


def test_list_everything_no_delimiter(s3, listing_bucket):
    pages = _check_v2(s3, listing_bucket, max_keys=173)
    assert len(pages) == 12


def test_list_default_page_size(s3, listing_bucket):
    pages = _check_v2(s3, listing_bucket)
    assert [p["KeyCount"] for p in pages] == [1000, 1000]


def test_list_top_level_delimiter(s3, listing_bucket):
    pages = _check_v2(s3, listing_bucket, delimiter="/", max_keys=7)
    assert len(pages) > 1


def test_list_prefix_delimiter(s3, listing_bucket):
    _check_v2(s3, listing_bucket, prefix="dir05/", delimiter="/", max_keys=13)
    _check_v2(s3, listing_bucket, prefix="deep/", delimiter="/", max_keys=3)
    _check_v2(s3, listing_bucket, prefix="deep/3/", delimiter="/")
    _check_v2(s3, listing_bucket, prefix="dir03/", delimiter="-", max_keys=1)
    _check_v2(s3, listing_bucket, prefix="odd/", delimiter="/", max_keys=4)
    _check_v2(s3, listing_bucket, delimiter="x", max_keys=50)
    _check_v2(s3, listing_bucket, prefix="dir", delimiter="/", max_keys=6)


def test_list_start_after(s3, listing_bucket):
    _check_v2(s3, listing_bucket, start_after="flat/00300", max_keys=250)
    _check_v2(s3, listing_bucket, start_after="dir07/", delimiter="/", max_keys=5)
    _check_v2(s3, listing_bucket, prefix="flat/", start_after="a")
    _check_v2(s3, listing_bucket, start_after="zzzz")


def test_list_no_match(s3, listing_bucket):
    page = s3.list_objects_v2(Bucket=listing_bucket, Prefix="nothing-here/")
    assert page["KeyCount"] == 0 and not page["IsTruncated"]
    assert "Contents" not in page and "CommonPrefixes" not in page


def test_paginator(s3, listing_bucket):
    pages = list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=listing_bucket, Delimiter="/", PaginationConfig={"PageSize": 9}))
    keys = [o["Key"] for p in pages for o in p.get("Contents", [])]
    prefixes = [c["Prefix"] for p in pages for c in p.get("CommonPrefixes", [])]
    exp_keys, exp_prefixes, _, _ = model_page(KEYS, "", "/", "", 10 ** 9)
    assert keys == exp_keys and prefixes == exp_prefixes


def test_encoding_type_url(s3, listing_bucket):
    """With EncodingType given explicitly botocore leaves the values as sent: they must decode
    (form-decoding, as botocore does) to the literal keys, and carry no spaces or control bytes."""
    for prefix in ("odd/", "ctrl/"):
        pages = _v2_all_pages(s3, listing_bucket, Prefix=prefix, EncodingType="url", MaxKeys=5)
        got = []
        for p in pages:
            assert p.get("EncodingType") == "url"
            assert urllib.parse.unquote_plus(p["Prefix"]) == prefix
            for o in p.get("Contents", []):
                raw = o["Key"]
                assert " " not in raw and not any(ord(c) < 0x20 for c in raw), repr(raw)
                got.append(urllib.parse.unquote_plus(raw))
        exp, _, _, _ = model_page(KEYS, prefix, "", "", 10 ** 9)
        assert got == exp
    pages = _v2_all_pages(s3, listing_bucket, Prefix="odd/", Delimiter="/", EncodingType="url")
    prefixes = [urllib.parse.unquote_plus(c["Prefix"]) for p in pages for c in p.get("CommonPrefixes", [])]
    _, exp_p, _, _ = model_page(KEYS, "odd/", "/", "", 10 ** 9)
    assert prefixes == exp_p
    # v1 as well.
    page = s3.list_objects(Bucket=listing_bucket, Prefix="ctrl/", EncodingType="url")
    assert [urllib.parse.unquote_plus(o["Key"]) for o in page["Contents"]] == sorted(CTRL_KEYS)


def test_raw_listing_without_encoding(kiln, listing_bucket):
    """Without encoding-type the XML carries the literal (XML-escaped) keys."""
    status, _, body = kh.signed_request(kiln, "GET", "/%s?list-type=2&prefix=odd%%2F" % listing_bucket)
    assert status == 200
    assert kh.xml_find(body, "Key") == sorted(ODD_KEYS, key=lambda k: k.encode())


def test_list_v1_with_marker(s3, listing_bucket):
    # With a delimiter: follow NextMarker.
    for prefix, delimiter, max_keys in [("", "/", 7), ("dir1", "/", 3), ("", "", 333), ("odd/", "", 4)]:
        marker = ""
        keys, prefixes = [], []
        pages = 0
        while True:
            args = {"Bucket": listing_bucket, "MaxKeys": max_keys}
            if prefix:
                args["Prefix"] = prefix
            if delimiter:
                args["Delimiter"] = delimiter
            if marker:
                args["Marker"] = marker
            page = s3.list_objects(**args)
            contents, cps, truncated, last = model_page(KEYS, prefix, delimiter, marker, max_keys)
            where = "v1 page %d prefix=%r delimiter=%r" % (pages, prefix, delimiter)
            assert [o["Key"] for o in page.get("Contents", [])] == contents, where
            assert [c["Prefix"] for c in page.get("CommonPrefixes", [])] == cps, where
            assert page["IsTruncated"] == truncated, where
            assert page.get("Marker", "") == marker, where
            if truncated and delimiter:
                assert page["NextMarker"] == last, where
            keys += contents
            prefixes += cps
            pages += 1
            if not truncated:
                break
            marker = page.get("NextMarker") or page["Contents"][-1]["Key"]
        exp_keys, exp_p, _, _ = model_page(KEYS, prefix, delimiter, "", 10 ** 9)
        assert keys == exp_keys and prefixes == exp_p
