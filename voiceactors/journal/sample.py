"""A realistic sample journal in solstone's on-disk format.

``write_sample_journal(dest, days=14, today=..., seed=0)`` writes config and
identity, four facets (one muted), people and companies with facet views and
observations, ``days`` days of segments (``stream.json``, ``audio.jsonl``,
``talents/audio.md``, ``talents/summary.md``) with a day ``talents/flow.md``,
activity records with participation, commitments, later story closures (some
reworded, to exercise the ledger's fuzzy match) and a few manual
``ledger_close`` edits, meeting events, weekly news, anticipated records for
today and tomorrow, and today's ``morning_briefing.json``.

The output depends only on ``seed``, ``days`` and ``today`` (no wall clock).
Small journals (``days <= 60``) have ~4-8 segments a day and a dozen people;
larger ones ~50 segments a day, up to 2,000 people and ~10 commitments a day,
the data for benchmarks. Files are written with plain ``open``/``write``: a
generated journal needs no durability.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import hashlib
import json
import os
import random
import shutil
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voiceactors import clock

MARKER = ".voiceactors-sample"
BIG_DAYS = 60


class SampleError(ValueError):
    """The destination cannot take a sample journal."""


# --- vocabulary ---------------------------------------------------------------------------

PRINCIPAL = ("Alex Rivera", "alex_rivera")

FACETS: dict[str, dict[str, Any]] = {
    "work": {"title": "Work", "description": "Northwind Labs: product and engineering",
             "color": "#1e90ff", "emoji": "💼"},
    "family": {"title": "Family", "description": "Home, kids and family logistics",
               "color": "#2e8b57", "emoji": "🏡"},
    "studio": {"title": "Studio", "description": "Ceramics studio and commissions on the side",
               "color": "#d2691e", "emoji": "🏺"},
    "archive": {"title": "Archive", "description": "Old consulting work, kept for reference",
                "color": "#808080", "emoji": "🗄️", "muted": True},
}

# name, facet, description (the dozen people of a small journal)
CORE_PEOPLE = [
    ("Maya Chen", "work", "Engineering manager at Northwind Labs; Alex's manager."),
    ("Jonas Weber", "work", "Product designer on the onboarding team."),
    ("Priya Natarajan", "work", "Product lead for billing and pricing."),
    ("Sam Okafor", "work", "Backend engineer; owns the data pipeline."),
    ("Zoë Martín", "work", "Partner manager at Bluefin Capital."),
    ("Daniel Park", "work", "CFO at Northwind Labs."),
    ("Jordan Rivera", "family", "Alex's partner."),
    ("Lucía Rivera", "family", "Alex's daughter, in third grade."),
    ("Helen Rivera", "family", "Alex's mother; lives across town."),
    ("Ravi Shah", "studio", "Owner of Harbor Café; commissioned a set of mugs."),
    ("Ines Duarte", "studio", "Curator at Duarte Gallery."),
    ("Tom Becker", "studio", "Clay and glaze supplier."),
]
CORE_COMPANIES = [
    ("Northwind Labs", "work", "Alex's employer: a product analytics startup."),
    ("Bluefin Capital", "work", "Investor and integration partner."),
    ("Harbor Café", "studio", "Café on the harbor; studio commission client."),
    ("Duarte Gallery", "studio", "Small gallery showing local ceramics."),
]
FIRST = ("Aiden Amara Ben Carla Chloe Dev Elena Emeka Farah Felix Grace Hana Hugo Isla Ivan Jade "
         "Kai Kenji Lara Leo Lina Marco Mei Mila Nadia Nico Noor Omar Paula Quinn Rosa Ruben Sara "
         "Selin Tariq Tess Uma Victor Wen Yara Yusuf Zara Björn Chiara Dmitri Eun Fatima Gustavo "
         "Ingrid Joaquín Kofi Leila Mateo Nia Oskar Renée Soren Thandiwe").split()
LAST = ("Abbott Adeyemi Alvarez Andersen Bauer Bianchi Brennan Castillo Costa Dahl Diaz Dubois "
        "Eriksen Fischer Fontaine Garcia Haddad Hansen Ito Jensen Kaur Kim Kowalski Lambert Lopez "
        "Mbeki Meyer Moreau Murphy Nakamura Novak Olsen Ortiz Petrov Quinn Rossi Sato Schmidt Silva "
        "Singh Sørensen Tanaka Torres Ueda Varga Vogel Wagner Walsh Yilmaz Young Zhang Zimmer").split()
CO_A = "Acme Alder Apex Beacon Birch Cedar Cobalt Crescent Delta Ember Fjord Granite Halcyon Iris Juniper Keystone Lumen Meridian Nimbus Orchid Pinnacle Quarry Redwood Summit Tidal Umber Vantage Willow".split()
CO_B = "Labs Partners Systems Analytics Health Logistics Studio Foods Energy Robotics Media Capital".split()

TOPICS = {
    "work": ["Q3 roadmap", "pricing page", "onboarding flow", "billing migration", "API rate limits",
             "mobile beta", "hiring plan", "churn report", "SOC 2 audit", "search relevance",
             "data pipeline", "launch checklist", "design system", "incident review",
             "partner integration", "board deck"],
    "family": ["school pickup schedule", "summer camp", "dentist appointments", "kitchen renovation",
               "grandma's birthday", "weekend hike", "car insurance", "soccer practice",
               "family budget"],
    "studio": ["glaze tests", "kiln firing", "café mug commission", "holiday market stall",
               "website photos", "clay order", "wheel-throwing workshop", "gallery submission"],
    "archive": ["old consulting invoices", "legacy reports"],
}
# extra topic words for large journals: real journals talk about far more
# than a dozen things, and a search benchmark over 1,000 days of the same 16
# topics would measure an unrealistically dense index
TOPIC_WORDS = {
    "work": ("billing search pricing onboarding mobile analytics partner hiring security reporting "
             "checkout payments notification export admin audit forecast retention invoicing "
             "localization".split(),
             "migration dashboard rollout experiment redesign backlog runbook spec postmortem "
             "benchmark contract renewal budget integration dataset pipeline roadmap launch "
             "survey offsite".split()),
    "family": ("school garden holiday birthday doctor piano camping bike library swim".split(),
               "plans schedule trip lessons forms party repairs budget".split()),
    "studio": ("porcelain stoneware raku glaze kiln mug bowl vase plate tile".split(),
               "batch order tests firing photos class commission delivery".split()),
}
ACTIVITIES = {
    "work": ["meeting", "call", "coding", "review", "planning", "email", "one_on_one"],
    "family": ["family_time", "errand", "call", "planning"],
    "studio": ["making", "email", "call", "planning"],
    "archive": ["email"],
}
TITLES = {
    "meeting": "{topic} sync with {p1}", "call": "Call with {p1} about the {topic}",
    "coding": "Deep work on the {topic}", "review": "Review of the {topic} with {p1}",
    "planning": "Planning the {topic}", "email": "Email catch-up on the {topic}",
    "one_on_one": "1:1 with {p1}", "family_time": "Family time: {topic}",
    "errand": "Errand for the {topic}", "making": "Studio session: {topic}",
}
LINES = [
    "I think the {topic} needs one more pass before Friday.",
    "Can we get the numbers for the {topic} by tomorrow?",
    "{p1} raised a good point about the {topic} timeline.",
    "Let's keep the scope of the {topic} small for now.",
    "The last round of feedback on the {topic} was mostly positive.",
    "I'll pull {p1} in, they know the {topic} best.",
    "We should write down what we decided about the {topic}.",
    "Honestly the {topic} is further along than I expected.",
]
OUTCOMES = [
    "agreed to keep the scope small", "found two open questions", "settled the timeline",
    "decided to revisit next week", "split the work in two", "got unblocked on the details",
]
# (present, past, object): a story closure sometimes reports the past tense
ACTIONS = [
    ("send", "sent", "{cp} the {topic} draft"), ("review", "reviewed", "the {topic} proposal"),
    ("share", "shared", "the {topic} numbers with {cp}"), ("write up", "wrote up", "notes on the {topic}"),
    ("update", "updated", "the {topic} timeline"), ("book", "booked", "a follow-up on the {topic}"),
    ("finish", "finished", "the first pass of the {topic}"), ("call", "called", "{cp} about the {topic}"),
    ("draft", "drafted", "a plan for the {topic}"), ("check", "checked", "the {topic} budget with {cp}"),
]
WHENS = ["by Friday", "tomorrow", "next week", "end of day", "before the next sync", "this week"]
LOCATIONS = {"work": ["Room 4B", "Zoom", "Northwind office, 3rd floor"],
             "family": ["Home", "Lincoln Elementary"], "studio": ["The studio", "Harbor Café"],
             "archive": ["Phone"]}


# --- model --------------------------------------------------------------------------------

@dataclass
class Person:
    id: str
    name: str
    type: str
    facet: str
    description: str
    observations: list = field(default_factory=list)


@dataclass
class Block:
    activity: str
    facet: str
    topic: str
    people: list            # [Person]
    segments: list          # ["HHMMSS_300"]
    start: int              # seconds since midnight
    end: int


@dataclass
class Scale:
    segments: tuple         # (min, max) per day
    people: int
    commitments: tuple      # (min, max) per day

    @classmethod
    def for_days(cls, days: int) -> "Scale":
        if days <= BIG_DAYS:
            return cls((4, 8), len(CORE_PEOPLE), (1, 4))
        return cls((44, 56), min(2000, max(len(CORE_PEOPLE), 2 * days)), (8, 12))


def slugify(name: str, taken: set) -> str:
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    base = "".join(c if c.isalnum() else "_" for c in ascii_name.lower()).strip("_") or "entity"
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}_{n}", n + 1
    taken.add(slug)
    return slug


def ledger_id(owner_id: str | None, action: str, counterparty_id: str | None) -> str:
    """The ledger item id of a commitment (as the notes define it)."""
    normalized = " ".join(action.strip().lower().split())
    key = f"{owner_id or ''}|{normalized}|{counterparty_id or ''}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _ms(day: _dt.date, seconds: int) -> int:
    return (calendar.timegm(day.timetuple()) + seconds) * 1000


def _iso_utc(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}{seconds // 60 % 60:02d}{seconds % 60:02d}"


def _clock(seconds: int, with_seconds: bool = True) -> str:
    text = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}"
    return f"{text}:{seconds % 60:02d}" if with_seconds else text


def _names(people: list) -> str:
    names = [p.name for p in people]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def _write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, "".join(_dump(r) + "\n" for r in rows))


# --- destination --------------------------------------------------------------------------

def _prepare(dest: Path) -> None:
    """Make ``dest`` an empty folder; only a previous sample may be cleared."""
    if dest.exists() and not dest.is_dir():
        raise SampleError(f"not a directory: {dest}")
    if dest.is_dir() and any(dest.iterdir()):
        if not (dest / MARKER).is_file():
            raise SampleError(f"refusing to write into non-empty {dest} (not a previous sample journal)")
        for child in dest.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    dest.mkdir(parents=True, exist_ok=True)


# --- people -------------------------------------------------------------------------------

def _make_people(rng: random.Random, scale: Scale) -> tuple[list, list]:
    taken = {PRINCIPAL[1]}
    people = [Person(slugify(n, taken), n, "Person", f, d) for n, f, d in CORE_PEOPLE]
    companies = [Person(slugify(n, taken), n, "Company", f, d) for n, f, d in CORE_COMPANIES]
    if scale.people > len(people):
        combos = [f"{a} {b}" for a in FIRST for b in LAST]
        rng.shuffle(combos)
        co_names = [f"{a} {b}" for a in CO_A for b in CO_B]
        rng.shuffle(co_names)
        for name, company in zip(combos[: scale.people - len(people)], co_names * 50):
            facet = rng.choices(["work", "family", "studio"], weights=[6, 1.5, 2.5])[0]
            role = {"work": f"Works at {company}.", "family": "Family friend.",
                    "studio": f"Studio contact from {company}."}[facet]
            people.append(Person(slugify(name, taken), name, "Person", facet, role))
        for name in co_names[: scale.people // 20]:
            companies.append(Person(slugify(name, taken), name, "Company", "work",
                                    f"{name}: a company Alex works with."))
    return people, companies


def _write_entities(root: Path, people: list, companies: list) -> None:
    _write_json(root / "entities" / PRINCIPAL[1] / "entity.json",
                {"id": PRINCIPAL[1], "name": PRINCIPAL[0], "type": "Person",
                 "is_principal": True, "aka": ["Alex"]})
    for ent in people + companies:
        ident = {"id": ent.id, "name": ent.name, "type": ent.type}
        first = ent.name.split()[0]
        if ent.type == "Person" and first != ent.name:
            ident["aka"] = [first]
        _write_json(root / "entities" / ent.id / "entity.json", ident)
        view = root / "facets" / ent.facet / "entities" / ent.id
        _write_json(view / "entity.json", {"entity_id": ent.id, "description": ent.description})
        if ent.observations:
            _write_jsonl(view / "observations.jsonl", ent.observations)


# --- config and identity ------------------------------------------------------------------

def _write_config(root: Path, today: _dt.date) -> None:
    _write_json(root / "config" / "journal.json", {
        "identity": {
            "name": PRINCIPAL[0], "preferred": "Alex", "bio": "Product engineer and weekend potter.",
            "pronouns": {"subject": "they", "object": "them", "possessive": "their",
                         "reflexive": "themselves"},
            "aliases": ["Alex", "AR"], "email_addresses": ["alex@example.com"],
            "timezone": "America/Denver",
        },
        "setup": {"completed_at": _ms(today - _dt.timedelta(days=400), 9 * 3600)},
        "agent": {"name": "sol", "name_status": "default", "named_date": None, "proposal_count": 0},
    })
    identity = root / "identity"
    identity.mkdir(parents=True, exist_ok=True)
    texts = {
        "self.md": "# Self\n\nAlex Rivera is a product engineer at Northwind Labs, a partner to "
                   "Jordan and parent to Lucía, and runs a small ceramics studio on weekends.\n",
        "partner.md": "# Partner\n\nsol is Alex's journal companion: brief, warm, and direct. "
                      "It keeps track of commitments and reminds Alex of what matters today.\n",
        "agency.md": "# Agency\n\nsol may remind Alex about open commitments and upcoming events, "
                     "and may close a commitment when Alex says it is done.\n",
        "awareness.md": "# Awareness\n\nAlex is busiest on weekday mornings; studio time is "
                        "usually Saturday. Family logistics peak around school pickup.\n",
        "digest.md": "# Digest\n\nRecent themes: the billing migration at work, Lucía's summer "
                     "camp plans, and the café mug commission.\n",
    }
    for name, text in texts.items():
        _write(identity / name, text)
    for slug, meta in FACETS.items():
        _write_json(root / "facets" / slug / "facet.json", meta)


# --- days ---------------------------------------------------------------------------------

def _topics(big: bool) -> dict:
    if not big:
        return TOPICS
    out = {}
    for facet, curated in TOPICS.items():
        firsts, seconds = TOPIC_WORDS.get(facet, ((), ()))
        combos = [f"{a} {b}" for a in firsts for b in seconds]
        out[facet] = list(dict.fromkeys(curated + combos))
    return out


def _plan_day(rng: random.Random, target: int, start: int, by_facet: dict, topics: dict) -> list:
    """Blocks of consecutive 5-minute segments from ``start`` (seconds)."""
    blocks, cursor, made = [], start, 0
    avg_gap = max(60, (12 * 3600 - 300 * target) // max(1, target // 2))
    while made < target:
        length = min(rng.randint(1, 4), target - made)
        if cursor + 300 * length > 23 * 3600 + 55 * 60:
            break
        facet = rng.choices(["work", "family", "studio", "archive"], weights=[6, 2, 2, 0.2])[0]
        activity = rng.choice(ACTIVITIES[facet])
        pool = by_facet[facet] or by_facet["work"]
        people = [] if activity in ("coding", "making") else rng.sample(pool, min(len(pool), rng.randint(1, 3)))
        segments = [_hms(cursor + 300 * i) + "_300" for i in range(length)]
        blocks.append(Block(activity, facet, rng.choice(topics[facet]), people, segments,
                            cursor, cursor + 300 * length))
        made += length
        cursor += 300 * length + rng.randint(0, 2 * avg_gap) // 300 * 300
    return blocks


def _block_texts(block: Block, rng: random.Random) -> tuple[str, str, str]:
    p1 = block.people[0].name.split()[0] if block.people else "Alex"
    title = TITLES[block.activity].format(topic=block.topic, p1=p1)
    title = title[0].upper() + title[1:]
    outcome = rng.choice(OUTCOMES)
    with_whom = f" with {_names(block.people)}" if block.people else ""
    summary = f"Worked on the {block.topic}{with_whom}; {outcome}."
    return title, summary, outcome


def _write_segments(day_dir: Path, day: _dt.date, block: Block, summary: str,
                    rng: random.Random, state: dict) -> None:
    p1 = block.people[0].name.split()[0] if block.people else "Alex"
    for i, seg in enumerate(block.segments):
        seg_summary = summary if i == 0 else (
            f"Continued on the {block.topic}: " + rng.choice(LINES).format(topic=block.topic, p1=p1))
        seg_dir = day_dir / "default" / seg
        os.mkdir(seg_dir)
        os.mkdir(seg_dir / "talents")
        _write(seg_dir / "stream.json", _dump({
            "stream": "default", "prev_day": state["prev_day"], "prev_segment": state["prev_seg"],
            "seq": state["seq"]}) + "\n")
        state.update(prev_day=day.strftime("%Y%m%d"), prev_seg=seg, seq=state["seq"] + 1)
        lines = [_dump({"raw": "raw.flac", "model": "parakeet", "duration": 300})]
        for i in range(rng.randint(3, 5)):
            speaker = 1 if i % 2 == 0 or not block.people else 2
            text = rng.choice(LINES).format(topic=block.topic, p1=p1)
            lines.append(_dump({"start": f"00:{i:02d}:{rng.randint(0, 59):02d}", "source": "mic",
                                "speaker": speaker, "text": text, "description": "conversation"}))
        _write(seg_dir / "audio.jsonl", "\n".join(lines) + "\n")
        _write(seg_dir / "talents" / "audio.md", f"# Audio Summary\n\n{seg_summary} "
               f"{rng.choice(LINES).format(topic=block.topic, p1=p1)}\n")
        _write(seg_dir / "talents" / "summary.md", seg_summary + "\n")


@dataclass
class Commitment:
    id: str
    entry: dict
    opened: _dt.date
    segment: str
    fate: str               # open | story | closed | dropped
    facet: str
    close_day: _dt.date | None = None


def _make_commitment(rng: random.Random, block: Block, day: _dt.date, today: _dt.date,
                     principal_first: bool) -> Commitment:
    other = rng.choice(block.people)
    if principal_first:
        owner, owner_id, cp, cp_id = PRINCIPAL[0], PRINCIPAL[1], other.name, other.id
    else:
        owner, owner_id, cp, cp_id = other.name, other.id, PRINCIPAL[0], PRINCIPAL[1]
    present, _past, obj = rng.choice(ACTIONS)
    action = f"{present} {obj.format(topic=block.topic, cp=cp.split()[0])}"
    entry = {"owner": owner, "owner_entity_id": owner_id, "action": action, "counterparty": cp,
             "counterparty_entity_id": cp_id, "when": rng.choice(WHENS),
             "context": f"From the {block.topic} conversation."}
    roll = rng.random()
    close_day = day + _dt.timedelta(days=rng.randint(1, 6))
    fate = "open"
    if close_day <= today:
        fate = "story" if roll < 0.45 else "closed" if roll < 0.50 else "dropped" if roll < 0.54 else "open"
    return Commitment(ledger_id(owner_id, action, cp_id), entry, day, block.segments[0], fate,
                      block.facet, close_day if fate != "open" else None)


def _closure(c: Commitment, rng: random.Random) -> dict:
    action = c.entry["action"]
    if rng.random() < 0.5:     # reworded: past tense, as a later story would report it
        for present, past, _obj in ACTIONS:
            if action.startswith(present + " "):
                action = past + action[len(present):]
                break
    return {"owner": c.entry["owner"], "owner_entity_id": c.entry["owner_entity_id"],
            "action": action, "counterparty": c.entry["counterparty"],
            "counterparty_entity_id": c.entry["counterparty_entity_id"],
            "resolution": rng.choice(["done", "sent"])}


def _record(block: Block, day: _dt.date, title: str, summary: str, outcome: str) -> dict:
    created = _ms(day, block.end)
    participation = [{"name": p.name, "role": "attendee", "source": "voice", "confidence": 0.9,
                      "context": f"discussed the {block.topic}", "entity_id": p.id}
                     for p in block.people]
    return {
        "id": f"{block.activity}_{block.segments[0]}", "activity": block.activity,
        "segments": block.segments, "level_avg": 0.8, "title": title,
        "description": summary, "details": f"Outcome: {outcome}.", "facet": block.facet,
        "source": "cogitate", "active_entities": [p.id for p in block.people],
        "participation": participation, "hidden": False,
        "story": {"talent": "story", "body": f"{title}. {summary}", "topics": [block.topic],
                  "confidence": 0.8},
        "commitments": [], "closures": [], "decisions": [],
        "edits": [{"timestamp": _iso_utc(created),
                   "actor": "cogitate:activities", "fields": ["title", "description", "details"],
                   "note": "synthesized activity summary"}],
        "created_at": created,
    }


def _anticipated(rng: random.Random, day: _dt.date, facet: str, activity: str, start: int,
                 minutes: int | None, title: str, people: list, prep: str,
                 cancelled: bool = False) -> dict:
    participation = [{"name": p.name, "role": "attendee", "source": "calendar", "confidence": 0.95,
                      "context": "on the invite", "entity_id": p.id} for p in people]
    return {
        "id": f"anticipated_{activity}_{_hms(start)}_{day.strftime('%m%d')}", "activity": activity,
        "target_date": day.isoformat(), "start": _clock(start),
        "end": _clock(start + 60 * minutes) if minutes else None, "title": title,
        "description": title, "details": "", "facet": facet, "source": "anticipated",
        "active_entities": [p.id for p in people], "participation": participation,
        "participation_confidence": 0.9, "location": rng.choice(LOCATIONS[facet]),
        "prep_notes": prep, "cancelled": cancelled, "hidden": False,
        "edits": [{"timestamp": f"{(day - _dt.timedelta(days=1)).isoformat()}T20:00:00Z",
                   "actor": "schedule", "fields": ["activity", "target_date", "start", "end", "title"],
                   "note": "created by schedule"}],
        "created_at": _ms(day - _dt.timedelta(days=1), 20 * 3600),
    }


def _plan_anticipated(rng: random.Random, today: _dt.date, by_facet: dict, commitments: list) -> dict:
    """``{day: {facet: [records]}}`` for today and tomorrow."""
    w, f, s = by_facet["work"], by_facet["family"], by_facet["studio"]
    open_topic = next((c.entry["action"] for c in reversed(commitments) if c.fate == "open"
                       and w[0].id in (c.entry["owner_entity_id"], c.entry["counterparty_entity_id"])), "")
    tomorrow = today + _dt.timedelta(days=1)
    today_recs = [
        _anticipated(rng, today, "work", "meeting", 9 * 3600 + 1800, 30, "Standup with the billing team",
                     w[:3], "Bring the migration status."),
        _anticipated(rng, today, "work", "one_on_one", 11 * 3600, 45, f"1:1 with {w[0].name}", w[:1],
                     f"Open item: {open_topic}." if open_topic else "Career goals check-in."),
        _anticipated(rng, today, "family", "errand", 15 * 3600 + 1800, 30, "School pickup",
                     f[1:2], "Lucía has soccer practice after."),
        _anticipated(rng, today, "studio", "call", 17 * 3600, 20, f"Call with {s[0].name} about the mugs",
                     s[:1], "Confirm glaze colour and delivery date."),
        _anticipated(rng, today, "work", "deadline", 17 * 3600, None, "Board deck due", [],
                     "Numbers from Daniel are still missing."),
        _anticipated(rng, today, "work", "meeting", 14 * 3600, 60, "Pricing review (moved)", w[2:4],
                     "", cancelled=True),
        _anticipated(rng, today, "archive", "call", 12 * 3600, 30, "Old client check-in", [],
                     "Muted facet: should not show."),
    ]
    tomorrow_recs = [
        _anticipated(rng, tomorrow, "work", "meeting", 10 * 3600, 60, "Q3 roadmap review", w[:4],
                     "Read Priya's draft first."),
        _anticipated(rng, tomorrow, "family", "family_time", 18 * 3600, 90, "Helen's birthday dinner",
                     f[:3], "Pick up the cake."),
    ]
    out: dict = {}
    for rec in today_recs + tomorrow_recs:
        out.setdefault(rec["target_date"], {}).setdefault(rec["facet"], []).append(rec)
    return out


def _write_briefing(root: Path, today: _dt.date, anticipated: dict, yesterday: list,
                    commitments: list, news: dict) -> None:
    todays = [r for recs in anticipated.get(today.isoformat(), {}).values() for r in recs
              if r["facet"] != "archive" and not r["cancelled"]]
    todays.sort(key=lambda r: r["start"] or "")
    your_day = [{"start": (r["start"] or "")[:5], "end": (r["end"] or r["start"] or "")[:5],
                 "text": f"{r['title']}. {r['prep_notes']}".strip()} for r in todays]
    open_items = [c for c in commitments
                  if c.fate == "open" and c.opened < today and not FACETS[c.facet].get("muted")][-3:]
    needs = [{"text": f"{c.entry['owner']} committed to {c.entry['action']} for "
                      f"{c.entry['counterparty']} ({c.entry['when']}).",
              "source_id": f"sol://{c.opened.strftime('%Y%m%d')}/default/{c.segment}"}
             for c in reversed(open_items)]
    tomorrow = [r for recs in anticipated.get((today + _dt.timedelta(days=1)).isoformat(), {}).values()
                for r in recs]
    forward = [f"**Tomorrow** — {r['title']} at {r['start'][:5]}." for r in tomorrow]
    forward.append("Friday — the board deck goes to Daniel for review.")
    reading = [{"facet": facet, "summary": headline} for facet, headline in sorted(news.items())]
    _write_json(root / "chronicle" / today.strftime("%Y%m%d") / "talents" / "morning_briefing.json", {
        "metadata": {
            "generated": f"{today.isoformat()}T06:45:00", "model": "sample-generator",
            "sources": {"segments": len(yesterday), "anticipated_activities": len(todays),
                        "facet_newsletters": len(reading), "followups": len(needs)},
            "gaps": [],
            "coverage_preamble": f"Built from {len(yesterday)} segments yesterday, {len(todays)} "
                                 f"anticipated activities today and {len(needs)} follow-ups.",
        },
        "your_day": your_day,
        "yesterday": yesterday[:3],
        "needs_attention": needs,
        "forward_look": forward,
        "reading": reading,
    })


def write_sample_journal(dest: Path, *, days: int = 14, today: _dt.date, seed: int = 0) -> Path:
    """Write a sample journal of ``days`` days ending ``today`` into ``dest``.

    ``dest`` must be missing, empty, or a previous sample (which is replaced);
    SampleError otherwise. Blocking; returns ``dest``.
    """
    if days < 1:
        raise SampleError("days must be at least 1")
    dest = Path(dest)
    _prepare(dest)
    rng = random.Random(seed)
    scale = Scale.for_days(days)
    people, companies = _make_people(rng, scale)
    by_facet = {f: [p for p in people if p.facet == f] for f in FACETS}
    topics = _topics(days > BIG_DAYS)
    _write_config(dest, today)

    commitments: list[Commitment] = []
    pending: dict[_dt.date, list[Commitment]] = {}
    state = {"prev_day": None, "prev_seg": None, "seq": 0}
    yesterday_lines: list[str] = []
    latest_news: dict[str, str] = {}
    first = today - _dt.timedelta(days=days - 1)
    for offset in range(days):
        day = first + _dt.timedelta(days=offset)
        key = day.strftime("%Y%m%d")
        day_dir = dest / "chronicle" / key
        target = rng.randint(*scale.segments)
        is_today = day == today
        blocks = _plan_day(rng, max(2, target // 3) if is_today else target, 8 * 3600, by_facet, topics)
        (day_dir / "default").mkdir(parents=True)
        records: dict[str, list] = {}
        events: dict[str, list] = {}
        flow = ["# Daily Flow Summary", ""]
        social = []
        for block in blocks:
            title, summary, outcome = _block_texts(block, rng)
            _write_segments(day_dir, day, block, summary, rng, state)
            rec = _record(block, day, title, summary, outcome)
            records.setdefault(block.facet, []).append(rec)
            flow.append(f"{_clock(block.start, False)} {title}. {summary}\n")
            if block.people:
                social.append((block, rec))
                for p in block.people:
                    if rng.random() < 0.2 or not p.observations:
                        p.observations.append({"content": f"{summary}", "observed_at": rec["created_at"],
                                               "source_day": key})
            if block.activity in ("meeting", "call", "one_on_one") and block.people:
                events.setdefault(block.facet, []).append({
                    "type": "meeting", "start": _clock(block.start), "end": _clock(block.end),
                    "title": title, "summary": summary, "facet": block.facet, "agent": "meetings",
                    "occurred": True, "source": f"{key}/talents/flow.md",
                    "participants": [PRINCIPAL[0]] + [p.name for p in block.people],
                    "work": block.facet == "work", "details": f"Outcome: {outcome}."})
            if day == today - _dt.timedelta(days=1):
                yesterday_lines.append(f"{summary} ([{title}](sol://{key}/default/{block.segments[0]}))")
        # commitments opened today, and closures of earlier ones that land today
        if social:
            for _ in range(rng.randint(*scale.commitments)):
                block, rec = rng.choice(social)
                c = _make_commitment(rng, block, day, today, rng.random() < 0.6)
                rec["commitments"].append(c.entry)
                commitments.append(c)
                if c.fate in ("closed", "dropped"):
                    assert c.close_day is not None   # only an "open" fate has no close day
                    rec["edits"].append({
                        "timestamp": f"{c.close_day.isoformat()}T18:00:00Z", "actor": "voice",
                        "fields": ["ledger_close"],
                        "note": f"resolution: {'dropped' if c.fate == 'dropped' else 'done'}",
                        "ledger_close": {"item_id": c.id, "as_state": c.fate}})
                elif c.fate == "story":
                    assert c.close_day is not None   # only an "open" fate has no close day
                    pending.setdefault(c.close_day, []).append(c)
        all_records = [r for recs in records.values() for r in recs]
        for c in pending.pop(day, []):
            if all_records:
                rng.choice(all_records)["closures"].append(_closure(c, rng))
        for facet, recs in records.items():
            _write_jsonl(dest / "facets" / facet / "activities" / f"{key}.jsonl", recs)
        for facet, evs in events.items():
            _write_jsonl(dest / "facets" / facet / "events" / f"{key}.jsonl", evs)
        (day_dir / "talents").mkdir(parents=True, exist_ok=True)
        _write(day_dir / "talents" / "flow.md", "\n".join(flow) + "\n")
        if offset % 7 == 6 or day == today - _dt.timedelta(days=1):
            work_topic = next((b.topic for b in blocks if b.facet == "work"), "launch checklist")
            headline = f"Progress on the {work_topic}"
            latest_news["work"] = headline
            news_dir = dest / "facets" / "work" / "news"
            news_dir.mkdir(parents=True, exist_ok=True)
            _write(news_dir / f"{key}.md", f"# {day.isoformat()} News - Work\n\n## {headline}\n"
                   f"**Source:** internal | **Time:** 17:00\nThe {work_topic} moved forward; "
                   f"the team {rng.choice(OUTCOMES)}.\n")

    anticipated = _plan_anticipated(rng, today, by_facet, commitments)
    for iso_day, by_f in anticipated.items():
        key = iso_day.replace("-", "")
        for facet, recs in by_f.items():
            path = dest / "facets" / facet / "activities" / f"{key}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("".join(_dump(r) + "\n" for r in recs))
    latest_news.setdefault("studio", "Glaze test results are in")
    _write_briefing(dest, today, anticipated, yesterday_lines, commitments, latest_news)
    _write_entities(dest, people, companies)
    _write_json(dest / MARKER, {"generator": "voiceactors", "seed": seed, "days": days,
                                "today": today.isoformat()})
    return dest


def cli_sample(args) -> int:
    """``voiceactors journal sample DIR [--days N] [--today YYYY-MM-DD] [--seed S]``."""
    try:
        today = clock.parse_day(args.today) if args.today else clock.today()
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.days > BIG_DAYS:   # said before the wait, so a typo in --days can still be stopped
        print(f"writing a {args.days}-day sample journal: about {_megabytes(estimated_bytes(args.days))} "
              f"on disk (Ctrl-C stops)", file=sys.stderr, flush=True)
    try:
        dest = write_sample_journal(Path(args.dir), days=args.days, today=today, seed=args.seed)
    except SampleError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(f"wrote a {args.days}-day sample journal ending {today.isoformat()} to {dest} "
          f"({_megabytes(disk_bytes(dest))} on disk)")
    return 0


def estimated_bytes(days: int) -> int:
    """About how much disk a sample of ``days`` days takes (within ~20 % from
    2 to 365 days). Its files are small, so the disk holds about one 4 KiB
    block per file and folder: ~50 a day, ~315 a day in a big sample (over
    ``BIG_DAYS``: many more segments a day)."""
    per_day = 50 if days <= BIG_DAYS else 315
    return days * per_day * 4096


def disk_bytes(root: Path) -> int:
    """The disk ``root``'s tree takes (allocated blocks, as ``du`` counts)."""
    return sum(p.lstat().st_blocks * 512 for p in (root, *root.rglob("*")))


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size < 10e6 else f"{size / 1e6:.0f} MB"
