"""VQA accuracy as the official evaluation computes it today.

The reference is `PythonEvaluationTools/vqaEvaluation/vqaEval.py` of GT-Vision-Lab/VQA at commit
a013f0043c1e2cdc995922dfe257f7149aa9af06 ("Fixed processing answers bug", 2021-03-11), the
script the EvalAI server runs. Per question:

1. the prediction and the ten human answers lose newlines, tabs and surrounding spaces;
2. only when the human answers disagree (more than one distinct string) are the prediction AND
   every human answer normalised alike: punctuation, then lower case, number words to digits,
   articles dropped, contractions restored. When all ten agree nothing else is done, so `LARGE`
   scores 0 against ten `large` (the 2016 script normalised the prediction always and the human
   answers' punctuation only, which scored it 100 and scored `2` against `two`x7 at 30);
3. for each human answer left out, min(1, #other answers equal to the prediction / 3); the
   question scores the mean over the ten. "Other" are the answer records that differ from the
   one left out, compared whole, as the script does: real records differ by `answer_id`.

Overall, per answer type and per question type: the mean of the questions' scores, times 100,
rounded to 2 decimals with Python 3's `round`. (The repository's script is Python 2, whose
`round` sends exact binary ties away from zero rather than to even; on free-text predictions over
the smoke and mini sets, run under Python 2.7 and 3, it gave the figures this module gives.) The
punctuation list has been the same since 2015 (commit 13cbf5e): the 2021 commit changed which
answers are normalised, not how.
"""

from __future__ import annotations

import re
from collections import defaultdict

from ..data.errors import require_same_ids

CONTRACTIONS = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "Id've": "I'd've",
    "I'dve": "I'd've",
    "Im": "I'm",
    "Ive": "I've",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}
NUMBER_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
ARTICLES = {"a", "an", "the"}
# The official list (no period, apostrophe or colon: a period has its own rule, below).
PUNCTUATION = [
    ";",
    "/",
    "[",
    "]",
    '"',
    "{",
    "}",
    "(",
    ")",
    "=",
    "+",
    "\\",
    "_",
    "-",
    ">",
    "<",
    "@",
    "`",
    ",",
    "?",
    "!",
]
# A period not followed by a digit ("3.5" keeps its point, "5." loses it). The official pattern,
# verbatim: its `(?!<=\d)` reads as a look-ahead for "<=" and a digit, not as a look-behind.
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_BETWEEN_DIGITS = re.compile(r"(\d)(,)(\d)")


def process_punctuation(text: str) -> str:
    out = text
    for p in PUNCTUATION:
        # Punctuation glued to a word ("yes!") becomes a space; next to a space, or anywhere in a
        # text with a comma between digits, it is dropped.
        if (p + " " in text or " " + p in text) or _COMMA_BETWEEN_DIGITS.search(text):
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    # The official call passes re.UNICODE (32) where `count` goes: at most 32 periods go. Kept.
    return _PERIOD_STRIP.sub("", out, count=re.UNICODE)


def process_digit_article(text: str) -> str:
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in ARTICLES]
    return " ".join(CONTRACTIONS.get(w, w) for w in words)


def _strip(answer: str) -> str:
    return answer.replace("\n", " ").replace("\t", " ").strip()


def normalize_answer(answer: str) -> str:
    """What the official evaluation does to the prediction and to each human answer of a question
    whose human answers disagree (and only then)."""
    return process_digit_article(process_punctuation(_strip(answer)))


def _humans_disagree(records: list[dict]) -> bool:
    """The official code normalises answers (punctuation, digits, articles) only for a question
    whose human answers are not all the same string."""
    return len({r["answer"] for r in records}) > 1


def question_accuracy(prediction: str, human_answers: list) -> float:
    """Soft accuracy of one prediction against the (usually 10) human answers, in [0, 1].

    human_answers: the annotation's answer records ({"answer": ..., "answer_id": ...}) or plain
    strings, each string one person's answer.
    """
    # Records are compared whole when one is left out; strings are told apart by position.
    records = [
        dict(h, answer=_strip(h["answer"])) if isinstance(h, dict) else {"answer": _strip(h), "position": k}
        for k, h in enumerate(human_answers)
    ]
    predicted = _strip(prediction)
    if _humans_disagree(records):
        records = [dict(r, answer=normalize_answer(r["answer"])) for r in records]
        predicted = normalize_answer(predicted)
    scores = []
    for left_out in records:
        matches = sum(r["answer"] == predicted for r in records if r != left_out)
        scores.append(min(1.0, matches / 3))
    return sum(scores) / len(scores)


def vqa_accuracy(annotations: dict[int, dict], predictions: dict[int, str], digits: int = 2, source=None) -> dict:
    """Official VQA accuracy.

    annotations: question_id -> official annotation record (answers, answer_type, question_type).
    predictions: question_id -> predicted answer string, for exactly the annotated questions:
    the official `loadRes` refuses results that miss a question or answer one it does not have.
    source: the predictions file, named in that refusal.
    """
    require_same_ids(annotations, predictions, "question_id", source)
    per_question, by_answer_type, by_question_type = {}, defaultdict(list), defaultdict(list)
    for question_id, ann in annotations.items():
        acc = question_accuracy(predictions[question_id], ann["answers"])
        per_question[question_id] = acc
        by_answer_type[ann["answer_type"]].append(acc)
        by_question_type[ann["question_type"]].append(acc)
    pct = lambda xs: round(100 * sum(xs) / len(xs), digits)
    return {
        "overall": pct(list(per_question.values())),
        "perAnswerType": {k: pct(v) for k, v in sorted(by_answer_type.items())},
        "perQuestionType": {k: pct(v) for k, v in sorted(by_question_type.items())},
        "n_questions": len(per_question),
    }


def pair_accuracy(
    annotations: dict[int, dict], predictions: dict[int, str], pairs: list[tuple[int, int]], digits: int = 2
) -> float:
    """The share of complementary pairs (the same question on two images with different answers)
    whose two members are both answered with their most common human answer
    (`multiple_choice_answer`), in percent. A
    model that gives both members one answer, as any model that does not look at the image does,
    scores 0. Answers are compared as the official accuracy compares them (normalised only where the
    humans disagree). Pairs with a member outside `annotations` are left out; the measure of the
    VQA v2 paper's balanced pairs, not of the official code."""
    kept = [(a, b) for a, b in pairs if a in annotations and b in annotations]
    if not kept:
        raise ValueError("no complementary pair has both questions annotated")

    def right(q) -> bool:
        # Compared as the official accuracy compares: normalised only where the humans disagree.
        predicted, chosen = _strip(predictions[q]), _strip(annotations[q]["multiple_choice_answer"])
        humans = [{"answer": _strip(h["answer"] if isinstance(h, dict) else h)} for h in annotations[q]["answers"]]
        if _humans_disagree(humans):
            predicted, chosen = normalize_answer(predicted), normalize_answer(chosen)
        return predicted == chosen

    return round(100 * sum(right(a) and right(b) for a, b in kept) / len(kept), digits)
