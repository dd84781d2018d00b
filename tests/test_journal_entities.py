"""Entities (identity records, facet views, observations) and facets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from voiceactors.journal import entities, facets
from voiceactors.journal.paths import InvalidName


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def write_entity(root: Path, eid: str, name: str, **extra) -> None:
    write_json(root / "entities" / eid / "entity.json", {"id": eid, "name": name, "type": "Person", **extra})


def write_facet(root: Path, slug: str, **extra) -> None:
    write_json(root / "facets" / slug / "facet.json", {"title": slug.title(), **extra})


def write_view(root: Path, facet: str, eid: str, description: str | None, observations=(), raw=(), **extra) -> None:
    folder = root / "facets" / facet / "entities" / eid
    if description is not None:
        write_json(folder / "entity.json", {"entity_id": eid, "description": description, **extra})
    if observations or raw:
        folder.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(o) for o in observations] + list(raw)
        (folder / "observations.jsonl").write_text("".join(line + "\n" for line in lines))


# --- facets ------------------------------------------------------------------------


def test_fixture_facets(fixture_journal):
    slugs = [f.slug for f in facets.all_facets(fixture_journal)]
    assert "broken-facet" not in slugs  # a folder without facet.json is not a facet
    assert "work" not in slugs          # nor is one with only activities
    assert {"verona", "montague", "muted-test", "minimal-facet"} <= set(slugs)
    assert slugs == sorted(slugs)
    enabled = [f.slug for f in facets.enabled_facets(fixture_journal)]
    assert "muted-test" not in enabled and "verona" in enabled
    verona = facets.get_facet(fixture_journal, "verona")
    assert (verona.title, verona.description, verona.muted, verona.emoji) == (
        "Verona", "Cross-company Verona Platform collaboration", False, "🌹")
    minimal = facets.get_facet(fixture_journal, "minimal-facet")
    assert (minimal.title, minimal.description, minimal.color) == ("Minimal Facet", "", "")
    assert facets.get_facet(fixture_journal, "broken-facet") is None


def test_corrupt_facet_json_is_left_out_and_logged(tmp_path):
    write_facet(tmp_path, "good")
    write_json(tmp_path / "facets" / "bad" / "facet.json", "{oops")
    with capture_logs() as logs:
        assert [f.slug for f in facets.all_facets(tmp_path)] == ["good"]
    assert any(e["event"] == "journal.json_corrupt" for e in logs)


def test_facet_names_are_validated(tmp_path):
    for bad in ("../x", "a/b", "", ".hidden", "..", "a..b"):
        with pytest.raises(InvalidName):
            facets.get_facet(tmp_path, bad)


def test_symlinked_facet_outside_the_journal_is_skipped(tmp_path):
    outside = tmp_path / "outside"
    write_json(outside / "facet.json", {"title": "Evil"})
    root = tmp_path / "journal"
    write_facet(root, "fine")
    (root / "facets" / "evil").symlink_to(outside, target_is_directory=True)
    assert [f.slug for f in facets.all_facets(root)] == ["fine"]
    with pytest.raises(InvalidName):
        facets.get_facet(root, "evil")


# --- entities -------------------------------------------------------------------------


def test_fixture_entities(fixture_journal):
    all_ = entities.load_entities(fixture_journal)
    assert len(all_) >= 30 and "romeo_montague" in all_
    romeo = entities.get_entity(fixture_journal, "romeo_montague")
    assert (romeo.name, romeo.type, romeo.is_principal) == ("Romeo Montague", "Person", True)
    assert entities.get_entity(fixture_journal, "romeo montague") == romeo
    assert entities.get_entity(fixture_journal, "ROMEO  Montague") == romeo
    assert entities.get_entity(fixture_journal, "nobody at all") is None


def test_fixture_facet_views_newest_first(fixture_journal):
    views = entities.facet_views(fixture_journal, "romeo_montague")
    assert [v.facet for v in views] == ["montague", "verona"]
    montague = views[0]
    assert montague.description.startswith("CTO and co-founder")
    stamps = [o["observed_at"] for o in montague.observations]
    assert stamps == sorted(stamps, reverse=True) and len(stamps) == 4
    assert montague.observations[0] == {"content": "Named co-lead of Verona Platform joint venture",
                                        "observed_at": 1773162000000, "source_day": "20260310"}


def test_fixture_iso_observed_at_is_converted(fixture_journal):
    (view,) = entities.facet_views(fixture_journal, "john_smith")
    assert view.facet == "test-facet"
    assert [o["source_day"] for o in view.observations] == ["20250125", "20250110"]
    assert view.observations[0]["observed_at"] == 1737820800000  # 2025-01-25T16:00:00Z


def test_aka_and_blocked(tmp_path):
    write_entity(tmp_path, "ada_l", "Ada Lovelace", aka=["Countess", "AL"])
    write_entity(tmp_path, "mallory", "Mallory", blocked=True, aka=["Mal"])
    assert entities.get_entity(tmp_path, "countess").id == "ada_l"
    assert entities.get_entity(tmp_path, "Ada_L").id == "ada_l"
    assert entities.get_entity(tmp_path, "mallory") is None
    assert entities.get_entity(tmp_path, "Mal") is None
    assert list(entities.load_entities(tmp_path)) == ["ada_l"]
    assert entities.load_entities(tmp_path, include_blocked=True)["mallory"].blocked is True
    assert entities.get_entity(tmp_path, "") is None
    assert entities.get_entity(tmp_path, "../../etc/passwd") is None


def test_views_detached_and_corrupt_observations(tmp_path):
    write_entity(tmp_path, "ada_l", "Ada Lovelace")
    for slug in ("alpha", "beta", "gamma"):
        write_facet(tmp_path, slug)
    write_view(tmp_path, "alpha", "ada_l", "Engineer", observations=[
        {"content": "old", "observed_at": 1000, "source_day": "20260101"},
        {"content": "new", "observed_at": 2000, "source_day": "20260102"},
    ], raw=["{broken"])
    write_view(tmp_path, "beta", "ada_l", "Gone", detached=True)
    write_view(tmp_path, "gamma", "ada_l", None, observations=[{"content": "only obs", "observed_at": 5}])
    with capture_logs() as logs:
        views = entities.facet_views(tmp_path, "ada_l")
    assert [v.facet for v in views] == ["alpha", "gamma"]
    assert [o["content"] for o in views[0].observations] == ["new", "old"]
    assert views[1].description == "" and views[1].observations[0]["source_day"] == ""
    skipped = [e for e in logs if e["event"] == "journal.jsonl_line_skipped"]
    assert len(skipped) == 1 and skipped[0]["line"] == 3
    with_detached = entities.facet_views(tmp_path, "ada_l", include_detached=True)
    assert [v.facet for v in with_detached] == ["alpha", "beta", "gamma"] and with_detached[1].detached


def test_view_slug_is_validated(tmp_path):
    for bad in ("../entities", "a/b", ""):
        with pytest.raises(InvalidName):
            entities.facet_views(tmp_path, bad)
        with pytest.raises(InvalidName):
            entities.load_entity(tmp_path, bad)
