"""Generated long prompts (`long_tokens` in a scenario): seeded documents of a target length with
a question at the end, for prefills of thousands of tokens without a dataset."""

from __future__ import annotations

import random

from rig.scenario.prompts import ChatMessage, Prompt

# The long-prompt vocabulary: sections of a made-up town's yearly report. Slots in braces are
# filled from the lists below, so a seed chooses both the order of sentences and their details.
_LONG_SECTIONS = {
    "The harbour": [
        "The harbour handled {count} fishing boats this year, a few more than the year before.",
        "Most of the catch was mackerel and crab, sold at the early market on {weekday} mornings.",
        "{name} repaired the north breakwater after the spring storms loosened several stones.",
        "A new crane was installed on the east quay, which shortened unloading times considerably.",
        "Visitors often asked about the old customs house, which now holds a small museum.",
        "The harbour master recorded the highest tide of the decade in the first week of {month}.",
        "Silt had built up near the slipway, so the channel was dredged over two calm weeks.",
        "Several families still mend their own nets on the harbour wall, as their parents did.",
        "The lifeboat crew was called out {count} times, twice in a single night in {month}.",
        "{name} started a weekly fish stall that sells directly to restaurants in {town}.",
        "Mooring fees were raised slightly to pay for new ladders and lighting on the pontoons.",
        "A seal pup that was found stranded on the slipway in {month} was returned to the sea.",
    ],
    "Schools and learning": [
        "The primary school enrolled {count} pupils and opened a second reading room.",
        "{name} ran an evening course in bookkeeping that filled up within a few days.",
        "Older students built a weather station on the school roof and post its readings.",
        "The library extended its opening hours on {weekday}s after a petition from parents.",
        "A travelling science fair stopped in {town} in {month} and drew crowds.",
        "Teachers reported that attendance improved once the bus timetable was changed.",
        "The adult language classes now cover Spanish, Polish and basic sign language.",
        "Donated laptops were refurbished by volunteers and lent to pupils without a computer.",
        "{name} organised a spelling bee that the whole of {town} seemed to attend.",
        "The secondary school garden now supplies vegetables to the canteen twice a week.",
        "A homework club meets in the church hall every {weekday} after lessons end.",
        "Parents raised money for a minibus so that sports teams can travel to away matches.",
    ],
    "Parks and gardens": [
        "Volunteers planted {count} trees along the river path, mostly oak, alder and rowan.",
        "The rose garden behind the town hall was replanted after years of neglect.",
        "{name} proposed a community orchard on the empty plot beside the railway station.",
        "A pair of herons nested by the mill pond for the first time in living memory.",
        "Dog owners and cyclists agreed on separate paths through the common.",
        "The allotments had a waiting list of more than two years by the end of {month}.",
        "Wildflower strips were left unmown along the verges, and bees returned within a season.",
        "The bandstand in the park was repainted in its original green and cream.",
        "{name} led guided walks on {weekday} evenings to spot bats along the old canal.",
        "The pond in the memorial garden was cleared of weed and restocked with native plants.",
        "Benches with the names of long-serving volunteers were placed along the cliff walk.",
        "A storm in {month} brought down an ancient beech, and its wood was carved into seats.",
    ],
    "Roads and transport": [
        "The coast road was resurfaced between the lighthouse and the quarry in {month}.",
        "{name} chaired the committee that finally agreed on a route for the new cycle lane.",
        "Buses to the county town now run every {minutes} minutes instead of once an hour.",
        "A footbridge over the railway replaced the level crossing parents feared.",
        "Parking in the market square was limited to two hours on {weekday}s.",
        "The old goods yard was cleared, and part of it now serves as a car park for the station.",
        "Complaints about potholes fell once the trust website had a reporting form.",
        "A night bus was trialled over the summer and will continue if ridership holds.",
        "{name} campaigned for a zebra crossing outside the school, and it was painted in {month}.",
        "The harbour car park now has charging points for {count} electric cars.",
        "Speed bumps on the high street divided opinion but slowed traffic noticeably.",
        "A bicycle repair workshop opens in the old fire station every {weekday} morning.",
    ],
    "Heritage and culture": [
        "The {year} festival drew around {count} visitors over three days of music and food.",
        "{name} catalogued the parish records, some of which date back four centuries.",
        "The windmill on the hill turned its sails again after a long restoration.",
        "A local choir recorded an album of sea shanties collected from retired fishermen.",
        "The trust received a grant to repair the stained glass in the chapel of rest.",
        "An exhibition of old photographs showed the high street as it looked a hundred years ago.",
        "Storytelling evenings on the last {weekday} of each month were well attended.",
        "The town's oldest pub was listed as a building of historic interest in {month}.",
        "{name} wrote a short history of {town}, and the first printing sold out in a month.",
        "The cinema club showed silent films with live piano accompaniment in {month}.",
        "Costumes from the pageant were mended and stored in the attic of the town hall.",
        "A mural by pupils of the primary school now covers the wall of the bus shelter.",
    ],
    "Finances": [
        "Membership fees and donations covered most of the trust's running costs this year.",
        "The accounts show a small surplus of {amount} pounds, which was set aside for repairs.",
        "{name} stepped down as treasurer after eleven years of service.",
        "Insurance premiums rose again, largely because of flood risk near the river.",
        "A charity auction in {month} raised enough to replace the roof of the scout hut.",
        "The trust now publishes its spending every quarter so members can follow each project.",
        "Grants from the county council fell, so more of the work relied on volunteers.",
        "The board agreed to keep the membership fee unchanged for at least another year.",
        "{name} set up online payments, which brought in younger members for the first time.",
        "Rent from the two shops the trust owns on the high street rose in line with inflation.",
        "The reserve fund now stands at {amount} pounds, enough for three months of costs.",
        "An independent examiner checked the accounts in {month} and found them in good order.",
    ],
}
_LONG_TOWNS = ["Harrowby", "Calder Sands", "Westmere", "Penlow", "Ashcombe", "Kirkhaven"]
_LONG_FILLERS = {
    "name": [
        "Margaret Ellison",
        "Tomasz Nowak",
        "Aisha Rahman",
        "Owen Pritchard",
        "Lucía Ortega",
        "Hiroshi Tanaka",
        "Grace Obi",
        "Dermot Kelly",
        "Ingrid Solberg",
        "Ravi Menon",
    ],
    "weekday": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"],
    "month": ["January", "March", "April", "June", "August", "September", "October", "November"],
    "count": ["forty", "sixty-two", "eighty", "120", "215", "three hundred", "1,400"],
    "minutes": ["twenty", "thirty", "forty"],
    "amount": ["1,250", "3,900", "6,400", "12,800"],
}
_LONG_QUESTION = (
    "Question: According to the reports above, what is the archive reference of the collection, "
    "and which two projects would you say mattered most to the town? Answer in one paragraph."
)
_LONG_NEEDLE = "For the record, the archive reference of this collection is {reference}."


def build_long_prompt(target_tokens: int, seed: int = 0) -> Prompt:
    """A deterministic document of about `target_tokens` tokens followed by a question.

    Long prompts exercise the chunked prefill across many chunks (and prefix-cache block
    boundaries). Length assumption: English prose at ~4 characters (~0.75 words) per token, so
    the text is cut at 4 * target_tokens characters, give or take one sentence (targets under
    ~100 tokens still get one section); real tokenizers land within roughly +-25%. The document
    is a run of yearly reports of a made-up town's civic trust; the seed picks the town, the
    first year, the order and details of the sentences and where an archive reference (which the
    closing question asks for) is placed.
    """
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be positive, got {target_tokens}")
    rng = random.Random(f"rig-long-prompt-{seed}")
    town = rng.choice(_LONG_TOWNS)
    year = rng.randrange(1990, 2015)
    needle = _LONG_NEEDLE.format(
        reference=f"{rng.choice('BCDFGHJKLMNPRSTVWXZ')}-{rng.randrange(1000, 10000)}"
    )
    needle_at = rng.randrange(max(1, 3 * target_tokens))
    budget = 4 * target_tokens - len(_LONG_QUESTION)

    blocks: list[str] = []
    used = 0  # length of "\n\n".join(blocks) plus the separator before the next block
    while not blocks or used < budget:  # even a tiny target gets one section and the needle
        blocks.append(f"# Annual report of the {town} civic trust, {year}")
        used += len(blocks[-1]) + 2
        for heading in rng.sample(list(_LONG_SECTIONS), len(_LONG_SECTIONS)):
            section = f"## {heading}\n\n"
            for template in rng.sample(_LONG_SECTIONS[heading], rng.randint(3, 6)):
                slots = {key: rng.choice(values) for key, values in _LONG_FILLERS.items()}
                section += ("" if section.endswith("\n") else " ") + template.format(
                    town=town, year=year, **slots
                )
                if needle and used + len(section) >= needle_at:
                    section += " " + needle
                    needle = ""
                if used + len(section) >= budget:
                    break
            blocks.append(section)
            used += len(section) + 2
            if used >= budget:
                break
        year += 1
    text = "\n\n".join([*blocks, _LONG_QUESTION])
    return Prompt(
        id=f"long-{target_tokens}-{seed}",
        messages=(ChatMessage("user", text),),
        source=f"build_long_prompt(target_tokens={target_tokens}, seed={seed})",
        category="long",
    )
