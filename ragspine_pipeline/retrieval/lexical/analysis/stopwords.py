"""Stop words per Snowball language, for the Unicode index analyzer.

Short lists of function words (articles, pronouns, auxiliaries, prepositions,
conjunctions, question words). Negations are kept out on purpose, as in the English list:
"not"/"nicht"/"не" change what a question asks. Words are stored as the analyzer sees
them (NFKC + casefold, before stemming), so the Greek final sigma is folded (ς → σ) and
German ß is "ss". Languages with a stemmer but no list here are stemmed without a stop
filter.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

# The project's English list, unchanged (the legacy "stop"/"english" analyzers use it).
ENGLISH = (
    "a about above after again against all am an and any are as at be because been before being below "
    "between both but by can could did do does doing down during each few for from further had has have "
    "having he her here hers herself him himself his how i if in into is it its itself just me more most "
    "my myself of off on once only or other our ours ourselves out over own same she should so some such "
    "than that the their theirs them themselves then there these they this those through to too under "
    "until up very was we were what when where which while who whom why will with would you your yours "
    "yourself yourselves s t d ll m o re ve y"
)

_RAW: dict[str, str] = {
    "english": ENGLISH,
    "german": (
        "aber als am an auch auf aus bei bin bis bist da damit dann das dass dem den der des dich die dies "
        "diese dieser dieses dir doch dort du durch ein eine einem einen einer eines er es euch euer für "
        "gegen hat hatte hatten hier ich ihm ihn ihnen ihr ihre im in ins ist ja jede jedem jeden jeder "
        "jedes man mich mir mit nach noch nun nur ob oder ohne sich sie sind so soll sollte über um und "
        "uns unser unter vom von vor war waren warum was weil welche welchem welchen welcher welches wenn "
        "wer werden wie wieder will wir wird wo wurde wurden zu zum zur"
    ),
    "french": (
        "à au aux avec ce ces cet cette dans de des du elle elles en est et été être eux il ils je la le "
        "les leur leurs lui ma mais me même mes moi mon nous on ou où par pour qu que quel quelle quelles "
        "quels qui sa sans se ses son sont sur ta te tes toi ton tu un une vos votre vous c d j l m s t y "
        "étaient était avait avaient ont a comment quand pourquoi"
    ),
    "spanish": (
        "a al algo como con cual cuales cuando de del donde el ella ellas ellos en entre era eran es esa "
        "esas ese eso esos esta estaba estas este esto estos fue fueron ha han hay la las le les lo los me "
        "mi mis muy nos o para pero por porque que qué quien quienes se su sus también te tu un una uno "
        "unos y ya cómo cuál cuándo dónde quién"
    ),
    "italian": (
        "a ad al alla alle ai agli anche che chi ci come con cui da dal dalla dei del della delle di e è "
        "ed era erano gli ha hanno i il in la le lo loro ma mi ne nei nel nella noi o per più quale quando "
        "questa queste questi questo se si sono su sua sue suo suoi tra un una uno vi voi perché dove"
    ),
    "portuguese": (
        "a ao aos as à às com como da das de do dos e é ela elas ele eles em entre era eram essa esse esta "
        "este eu foi foram há isso isto já lhe mas me meu minha muito na nas no nos o os ou para pela "
        "pelo por porque quando que quem se seu sua são também te um uma uns umas você qual onde"
    ),
    "dutch": (
        "aan al als bij dat de den der deze die dit doch door dus een en er ge had heb hebben heeft het hij "
        "hoe hun ik in is je kan maar me men met mij mijn naar nu of om omdat ons ook op over te tot u uit "
        "van veel voor want was waren wat we wel werd wie wij wordt zal ze zich zij zijn zo waar wanneer"
    ),
    "russian": (
        "и в во что он на я с со как а то все она так его но да ты к у же вы за бы по только ее её мне было "
        "вот от меня еще ещё о из ему когда даже ну ли если уже или быть был него до вас вам ведь там потом "
        "себя ей они тут где есть ней для мы тебя их чем была сам чтоб без чего тоже себе под будет ж тогда "
        "кто этот того потому этого какой ним здесь этом мой тем чтобы нее неё были куда зачем всех при об "
        "после над тот через эти нас про всего них какая эту моя свою этой перед том такой им более всю "
        "между какие каких какое какую каком это также который которая которое которые которых является"
    ),
    "greek": (
        "ο η το οι τα του της των τον την τους τις και να με σε σε στο στη στην στον στα στους στις από για "
        "που ως ένα μια μία ενός μιας είναι ήταν θα δεν ή αλλά αν όπως όταν πως πώς ποιος ποια ποιο ποιοι "
        "ποιες ποιά ποιό τι τί αυτό αυτή αυτός αυτά αυτές αυτοί επί κατά μετά προς χωρίς"
    ),
    "arabic": (
        "في من على إلى الى عن مع أن ان إن أو او ثم هذا هذه ذلك تلك التي الذي الذين اللذان اللتان هو هي هم "
        "هن أنا نحن أنت كان كانت يكون قد لقد لم لن ما ماذا متى أين اين كيف لماذا هل كل بعض عند بين حتى "
        "إذا اذا كما أي اي منذ وقد وهو وهي وكان وفي ومن"
    ),
    "hindi": (
        "का की के में है हैं और से को पर यह वह था थे थी कि भी एक लिए तो ने हो जो इस उस कर किया गया गई "
        "गए या हुआ हुई हुए रहा रही रहे कौन क्या कब कहाँ कहां कैसे क्यों किस किसने किसे"
    ),
    "turkish": (
        "acaba ama ve veya ile bir bu şu o da de ki mi mı mu mü için gibi kadar daha en çok ne neden nasıl "
        "nerede hangi kim ise olan olarak ya"
    ),
    "swedish": (
        "och att det som en på är av för med till den har de inte om ett han men var jag sig från vi så "
        "kan man när år säger hon under också efter eller nu sin där vid mot ska skulle hur vad vem vilken"
    ),
}


def _fold(word: str) -> str:
    return unicodedata.normalize("NFKC", word).casefold()


STOP_WORDS: dict[str, frozenset[str]] = {
    lang: frozenset(_fold(w) for w in words.split()) for lang, words in _RAW.items()
}


def stop_words_for(language: str) -> frozenset[str]:
    """The stop list of a Snowball language name (empty when there is none)."""
    return STOP_WORDS.get(language, frozenset())


# Latin-script languages with a stop list, English apart (what tells English from them).
_LATIN_LETTER = re.compile(r"[A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff]")
_OTHER_LATIN = {lang: words for lang, words in STOP_WORDS.items()
                if lang != "english" and any(_LATIN_LETTER.match(w) for w in words)}
_ANY_OTHER_LATIN = frozenset().union(*_OTHER_LATIN.values())


def latin_function_words(words: Iterable[str]) -> tuple[int, int, int]:
    """Among casefolded Latin-script words: (English function words, those of them no
    other listed Latin-script language shares, the most function words of its own that
    any other listed Latin-script language has). Why: function words are the evidence a
    short text carries of its language; a query's (``link.language_scope``) and a
    document's (``vector.language_profile``) are told English or not by the same counts."""
    words = list(words)
    english = STOP_WORDS["english"]
    en_any = sum(w in english for w in words)
    en_only = sum(w in english and w not in _ANY_OTHER_LATIN for w in words)
    other_only = max((sum(w in stop and w not in english for w in words) for stop in _OTHER_LATIN.values()),
                     default=0)
    return en_any, en_only, other_only
