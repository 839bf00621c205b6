"""VQA accuracy as the official evaluation (VQA v2 `vqaEval.py`) computes it.

Per question: the prediction is normalised (punctuation, number words to digits, articles
dropped, contractions restored); the human answers are punctuation-normalised when they
disagree; the score is the average over the 10 leave-one-out subsets of 9 human answers of
min(#humans in the subset who gave the prediction / 3, 1). Overall, per answer type and per
question type, as percentages rounded to 2 decimals. Per-type scores average the per-question
scores (the official script's current form).
"""

from __future__ import annotations

import re
from collections import defaultdict

CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "couldn'tve": "couldn't've", "couldnt've": "couldn't've", "didnt": "didn't", "doesnt": "doesn't",
    "dont": "don't", "hadnt": "hadn't", "hadnt've": "hadn't've", "hadn'tve": "hadn't've",
    "hasnt": "hasn't", "havent": "haven't", "hed": "he'd", "hed've": "he'd've", "he'dve": "he'd've",
    "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's", "Id've": "I'd've",
    "I'dve": "I'd've", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itd've": "it'd've",
    "it'dve": "it'd've", "itll": "it'll", "let's": "let's", "maam": "ma'am", "mightnt": "mightn't",
    "mightnt've": "mightn't've", "mightn'tve": "mightn't've", "mightve": "might've", "mustnt": "mustn't",
    "mustve": "must've", "neednt": "needn't", "notve": "not've", "oclock": "o'clock",
    "oughtnt": "oughtn't", "ow's'at": "'ow's'at", "'ows'at": "'ow's'at", "'ow'sat": "'ow's'at",
    "shant": "shan't", "shed've": "she'd've", "she'dve": "she'd've", "she's": "she's",
    "shouldve": "should've", "shouldnt": "shouldn't", "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've", "somebody'd": "somebodyd", "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've", "somebodyll": "somebody'll", "somebodys": "somebody's",
    "someoned": "someone'd", "someoned've": "someone'd've", "someone'dve": "someone'd've",
    "someonell": "someone'll", "someones": "someone's", "somethingd": "something'd",
    "somethingd've": "something'd've", "something'dve": "something'd've", "somethingll": "something'll",
    "thats": "that's", "thered": "there'd", "thered've": "there'd've", "there'dve": "there'd've",
    "therere": "there're", "theres": "there's", "theyd": "they'd", "theyd've": "they'd've",
    "they'dve": "they'd've", "theyll": "they'll", "theyre": "they're", "theyve": "they've",
    "twas": "'twas", "wasnt": "wasn't", "wed've": "we'd've", "we'dve": "we'd've", "weve": "we've",
    "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's",
    "whatve": "what've", "whens": "when's", "whered": "where'd", "wheres": "where's",
    "whereve": "where've", "whod": "who'd", "whod've": "who'd've", "who'dve": "who'd've",
    "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're",
    "whys": "why's", "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've", "wouldn'tve": "wouldn't've", "yall": "y'all", "yall'll": "y'all'll",
    "y'allll": "y'all'll", "yall'd've": "y'all'd've", "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've", "youd": "you'd", "youd've": "you'd've", "you'dve": "you'd've",
    "youll": "you'll", "youre": "you're", "youve": "you've",
}
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
                "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
ARTICLES = {"a", "an", "the"}
PUNCTUATION = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<",
               "@", "`", ",", "?", "!"]
# A period not between digits ("3.5" keeps its point). The official pattern, verbatim.
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_BETWEEN_DIGITS = re.compile(r"(\d)(,)(\d)")


def process_punctuation(text: str) -> str:
    out = text
    for p in PUNCTUATION:
        # Punctuation glued to a word ("yes!") is dropped; elsewhere it becomes a space.
        if (p + " " in text or " " + p in text) or _COMMA_BETWEEN_DIGITS.search(text):
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    # The official call passes re.UNICODE as `count` (= 32 replacements); kept for equal figures.
    return _PERIOD_STRIP.sub("", out, re.UNICODE)


def process_digit_article(text: str) -> str:
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    words = [w for w in words if w not in ARTICLES]
    return " ".join(CONTRACTIONS.get(w, w) for w in words)


def normalize_answer(answer: str) -> str:
    """The normalisation the official evaluation applies to a predicted answer."""
    answer = answer.replace("\n", " ").replace("\t", " ").strip()
    return process_digit_article(process_punctuation(answer))


def question_accuracy(prediction: str, human_answers: list[str]) -> float:
    """Soft accuracy of one prediction against the (usually 10) human answers, in [0, 1]."""
    predicted = normalize_answer(prediction)
    humans = [a.replace("\n", " ").replace("\t", " ").strip() for a in human_answers]
    if len(set(humans)) > 1:
        humans = [process_punctuation(a) for a in humans]
    scores = []
    for left_out in range(len(humans)):
        others = humans[:left_out] + humans[left_out + 1:]
        scores.append(min(1.0, sum(a == predicted for a in others) / 3))
    return sum(scores) / len(scores)


def vqa_accuracy(annotations: dict[int, dict], predictions: dict[int, str], digits: int = 2) -> dict:
    """Official VQA accuracy.

    annotations: question_id -> official annotation record (answers, answer_type, question_type).
    predictions: question_id -> predicted answer string; every annotated question must have one.
    """
    missing = [q for q in annotations if q not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} annotated questions have no prediction, e.g. question_id {missing[0]}")
    per_question, by_answer_type, by_question_type = {}, defaultdict(list), defaultdict(list)
    for question_id, ann in annotations.items():
        acc = question_accuracy(predictions[question_id], [a["answer"] for a in ann["answers"]])
        per_question[question_id] = acc
        by_answer_type[ann["answer_type"]].append(acc)
        by_question_type[ann["question_type"]].append(acc)
    pct = lambda xs: round(100 * sum(xs) / len(xs), digits)
    return {"overall": pct(list(per_question.values())),
            "perAnswerType": {k: pct(v) for k, v in sorted(by_answer_type.items())},
            "perQuestionType": {k: pct(v) for k, v in sorted(by_question_type.items())},
            "n_questions": len(per_question)}
