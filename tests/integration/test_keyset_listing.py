"""List* keyset paging (issue 11): paging through ListModels / ListEndpointConfigs with small
pages in every sort order gives exactly the order of a Python model (sort key, then the name
compared case-insensitively), with no row repeated or skipped, and a cursor stays valid while
rows are created and deleted between pages (a new row sorting before the cursor is not shown,
one after it is)."""

import concurrent.futures

import training_helpers as th
from training_helpers import sm  # noqa: F401 (module-scoped client fixture)

ROLE = "arn:aws:iam::123456789012:role/kiln-test"
CONTAINER = {"Image": "x"}


def page_through(call, member, **kwargs):
    seen, token, pages = [], None, 0
    while True:
        args = dict(kwargs)
        if token:
            args["NextToken"] = token
        page = call(**args)
        assert len(page[member]) <= kwargs.get("MaxResults", 10)
        seen += page[member]
        pages += 1
        assert pages < 200
        token = page.get("NextToken")
        if not token:
            return seen


def model_order(rows, name_member, sort_by, descending):
    if sort_by == "Name":
        key = lambda r: r[name_member].lower()  # noqa: E731
    else:
        key = lambda r: (r["CreationTime"].timestamp(), r[name_member].lower())  # noqa: E731
    return [r[name_member] for r in sorted(rows, key=key, reverse=descending)]


def test_models_and_configs_page_in_the_model_order(sm):  # noqa: F811
    tag = th.unique_name("ks")
    # Mixed case and concurrent creation, so creation times tie and names differ only in case.
    names = ["%s-%s%02d" % (tag, "AbCd"[i % 4], i) for i in range(36)]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        list(ex.map(lambda n: sm.create_model(ModelName=n, ExecutionRoleArn=ROLE, PrimaryContainer=CONTAINER),
                    names))
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        list(ex.map(lambda n: sm.create_endpoint_config(EndpointConfigName=n, ProductionVariants=[{
            "VariantName": "v", "ModelName": n, "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}]),
            names[:20]))
    try:
        everything = sm.list_models(NameContains=tag.upper(), MaxResults=100)["Models"]
        assert sorted(m["ModelName"] for m in everything) == sorted(names)
        for sort_by in ("Name", "CreationTime"):
            for order in ("Ascending", "Descending"):
                expected = model_order(everything, "ModelName", sort_by, order == "Descending")
                for size in (1, 7, 36):
                    got = page_through(sm.list_models, "Models", NameContains=tag, SortBy=sort_by,
                                       SortOrder=order, MaxResults=size)
                    assert [m["ModelName"] for m in got] == expected, (sort_by, order, size)
        configs = sm.list_endpoint_configs(NameContains=tag, MaxResults=100)["EndpointConfigs"]
        assert len(configs) == 20
        for order in ("Ascending", "Descending"):
            expected = model_order(configs, "EndpointConfigName", "CreationTime", order == "Descending")
            got = page_through(sm.list_endpoint_configs, "EndpointConfigs", NameContains=tag, SortOrder=order,
                               MaxResults=3)
            assert [c["EndpointConfigName"] for c in got] == expected
    finally:
        for n in names[:20]:
            sm.delete_endpoint_config(EndpointConfigName=n)


def test_a_cursor_survives_creates_and_deletes_between_pages(sm):  # noqa: F811
    tag = th.unique_name("kc")
    names = ["%s-m%02d" % (tag, i) for i in range(10)]
    for n in names:
        sm.create_model(ModelName=n, ExecutionRoleArn=ROLE, PrimaryContainer=CONTAINER)
    first = sm.list_models(NameContains=tag, SortBy="Name", SortOrder="Ascending", MaxResults=4)
    assert [m["ModelName"] for m in first["Models"]] == names[:4]
    # Before the cursor (not shown), after it (shown), and the next row deleted (skipped).
    sm.create_model(ModelName=tag + "-m00a", ExecutionRoleArn=ROLE, PrimaryContainer=CONTAINER)
    sm.create_model(ModelName=tag + "-M05A", ExecutionRoleArn=ROLE, PrimaryContainer=CONTAINER)
    sm.delete_model(ModelName=names[4])
    rest = page_through(sm.list_models, "Models", NameContains=tag, SortBy="Name", SortOrder="Ascending",
                        MaxResults=4, NextToken=first["NextToken"])
    assert [m["ModelName"] for m in rest] == names[5:6] + [tag + "-M05A"] + names[6:]
    for n in names[:4] + names[5:] + [tag + "-m00a", tag + "-M05A"]:
        sm.delete_model(ModelName=n)
