"""Generate ``app/samples/reviews.csv``: a small, licence-clear sample for the Classify tab.

The file holds 400 short, invented restaurant and cafe reviews (one or two
sentences, 8-35 words each) with a header ``text,label`` and labels
``positive`` / ``negative``, balanced 200/200 and shuffled.  About 15% of
each label are harder cases: mixed sentences whose overall sentiment is set by
the main clause ("The room was cramped, but the curry was superb." ->
positive) and negations ("not bad at all" -> positive, "never again" ->
negative).

Every phrase below was written for this project; no real businesses or people
are named.  The script and its output are released under the project's licence
(MIT, see pyproject.toml).

Output is deterministic (``random.Random(0)``, standard library only).
Rewrite the CSV with:

    python app/samples/make_reviews.py
"""

import csv
import random
from pathlib import Path

OUT = Path(__file__).with_name("reviews.csv")
N_PER_LABEL = 200
N_HARD = 30  # per label, about 15%

OPENERS = ["", "", "Honestly, ", "On our last visit ", "For the price, ", "Tonight ",
           "At this little corner cafe, ", "At the bistro near the market, ", "To be fair, ",
           "Stopped in for lunch and ", "First time here and ", "At the new noodle bar, "]
FOODS = ["the lamb stew", "the mushroom risotto", "the fish taco", "the lemon tart",
         "the breakfast burrito", "the pad thai", "the margherita pizza", "the chicken curry",
         "the almond croissant", "the ramen", "the veggie burger", "the carrot cake",
         "the seafood paella", "the beef brisket", "the tomato soup", "the house salad",
         "the dumpling soup", "the banana bread", "the grilled salmon", "the eggs benedict"]
DRINKS = ["the flat white", "the chai latte", "the iced matcha", "the cappuccino",
          "the hot chocolate", "the mint tea", "the espresso", "the mango lassi"]
ITEMS = FOODS + DRINKS
POS_ANY = ["was delicious", "was superb", "was a real treat", "was spot on", "was lovely",
           "was the best I have had in years", "was excellent value"]
POS_FOOD = ["was perfectly seasoned", "was cooked just right", "was fresh and generous",
            "was rich and comforting", "was beautifully presented", "was full of flavour"]
POS_DRINK = ["was smooth and rich", "was made with real care", "was perfectly balanced",
             "was just the right temperature"]
NEG_ANY = ["was bland", "was a real letdown", "tasted of nothing", "was tiny for the price",
           "was lukewarm and tasteless", "was forgettable"]
NEG_FOOD = ["was badly overcooked", "was greasy and heavy", "was far too salty", "was stone cold",
            "was burnt at the edges", "was a soggy mess", "had clearly been reheated"]
NEG_DRINK = ["was watery", "was bitter and burnt", "was sickly sweet", "was barely warm"]
ASPECTS = ["the staff", "the service", "the room", "the music", "the wait", "the terrace",
           "the prices", "the portions", "the coffee", "the decor", "the table", "the bill"]
POS_ASPECT = {
    "the staff": ["were friendly and quick", "were warm and attentive"],
    "the service": ["was quick and cheerful", "was relaxed but attentive"],
    "the room": ["was bright and cosy", "felt calm and welcoming"],
    "the music": ["was just the right volume", "set a nice mood"],
    "the wait": ["was short", "was barely five minutes"],
    "the terrace": ["was a lovely spot in the sun", "was peaceful"],
    "the prices": ["were very fair", "were reasonable"],
    "the portions": ["were generous", "were just right"],
    "the coffee": ["was strong and smooth", "was excellent"],
    "the decor": ["was charming", "was simple and tasteful"],
    "the table": ["was spotless", "had a great view"],
    "the bill": ["was a pleasant surprise", "was modest"],
}
NEG_ASPECT = {
    "the staff": ["were rude", "seemed to ignore us"],
    "the service": ["was painfully slow", "was careless"],
    "the room": ["was cramped and noisy", "felt grubby"],
    "the music": ["was deafening", "was grating"],
    "the wait": ["was almost an hour", "was ridiculous"],
    "the terrace": ["was dirty", "was full of wasps"],
    "the prices": ["were steep", "were absurd"],
    "the portions": ["were stingy", "were tiny"],
    "the coffee": ["was bitter", "was weak and sour"],
    "the decor": ["was tired", "was gloomy"],
    "the table": ["was sticky", "wobbled the whole time"],
    "the bill": ["was a shock", "had extra charges on it"],
}
POS_CLOSE = ["Will be back soon.", "Highly recommended.", "A real find.",
             "We left very happy.", "Worth every penny.", "Already planning the next visit."]
NEG_CLOSE = ["Not coming back.", "Avoid.", "Very disappointing.",
             "We left annoyed.", "A waste of money.", "Would not recommend."]
# Harder cases: negations and fixed phrases whose sentiment runs against their words.
POS_NEG = ["Not bad at all.", "No complaints whatsoever.", "I could not fault a thing.",
           "Never had a bad meal here.", "Nothing to complain about.", "Can't wait to return."]
NEG_NEG = ["Never again.", "Not worth the price.", "Nothing special at all.",
           "I would not go back.", "Not good at all.", "Never had worse."]


def cap(s):
    return s[0].upper() + s[1:]


def judge(rng, item, pos):
    """A judgement that fits the item: food and drinks get their own words."""
    own = (POS_DRINK if pos else NEG_DRINK) if item in DRINKS else (POS_FOOD if pos else NEG_FOOD)
    return rng.choice(own + (POS_ANY if pos else NEG_ANY))


def pick(rng):
    """An item and an aspect; a drink is never paired with "the coffee"."""
    item = rng.choice(ITEMS)
    aspects = [a for a in ASPECTS if not (item in DRINKS and a == "the coffee")]
    return item, rng.choice(aspects)


def simple(rng, pos):
    item, aspect = pick(rng)
    table, close = (POS_ASPECT, POS_CLOSE) if pos else (NEG_ASPECT, NEG_CLOSE)
    first = cap(rng.choice(OPENERS) + item + " " + judge(rng, item, pos))
    second = rng.choice([f"{cap(aspect)} {rng.choice(table[aspect])}.", rng.choice(close), ""])
    r = rng.random()
    if r < 0.2:  # aspect first, then the dish
        return f"{cap(aspect)} {rng.choice(table[aspect])}, and {item} {judge(rng, item, pos)}."
    if r < 0.55:  # join an aspect into the first sentence
        return f"{first} and {aspect} {rng.choice(table[aspect])}. {rng.choice(close)}"
    return f"{first}. {second}".strip()


def hard(rng, pos):
    item, aspect = pick(rng)
    kind = rng.randrange(3)
    if kind == 0:  # concession + main clause decides
        minor = rng.choice((NEG_ASPECT if pos else POS_ASPECT)[aspect])
        main = judge(rng, item, pos)
        link = rng.choice(["but", "yet", "but honestly"])
        return f"{cap(aspect)} {minor}, {link} {item} {main}."
    if kind == 1:  # "Although ..., ..." with the main clause last
        minor = judge(rng, item, not pos)
        main = rng.choice((POS_ASPECT if pos else NEG_ASPECT)[aspect])
        tail = rng.choice(POS_CLOSE if pos else NEG_CLOSE)
        return f"Although {item} {minor}, {aspect} {main}. {tail}"
    # negation phrase carries the sentiment
    phrase = rng.choice(POS_NEG if pos else NEG_NEG)
    lead = rng.choice(["I expected little from " + item, "We tried " + item,
                       "Came back for " + item, "Ordered " + item + " again"])
    return f"{lead}. {phrase}"


def main():
    rng = random.Random(0)
    seen, rows = set(), []
    for pos in (True, False):
        label = "positive" if pos else "negative"
        for n_target, make in ((N_HARD, hard), (N_PER_LABEL - N_HARD, simple)):
            n = 0
            while n < n_target:
                text = make(rng, pos)
                if text not in seen and 8 <= len(text.split()) <= 35:
                    seen.add(text)
                    rows.append((text, label))
                    n += 1
    rng.shuffle(rows)
    with OUT.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {OUT}")


if __name__ == "__main__":
    main()
