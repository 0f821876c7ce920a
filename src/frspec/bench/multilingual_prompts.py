"""Non-English benchmark prompts, where an English-counted token map misses most: continue a list of a program's
translated messages in the same language.

The corpus is a packaged one: Vim's message catalogs (Debian's vim-runtime package,
/usr/share/vim/vim*/lang/LANG/LC_MESSAGES/vim.mo; read with the standard library's gettext), about 2,000 real
translated sentences per language written by Vim's translators. A prompt shows the model a block of messages in
one language and asks for more in that language; the next block is its `reference`. Deterministic: each
catalog's messages in order of their English msgid. Category = language, so --num-prompts spreads over languages.
"""

from __future__ import annotations

import gettext
import glob
from pathlib import Path

from frspec.bench.prompt import Prompt
from frspec.errors import FrspecError

# Catalog directory name -> language name, chosen to span scripts and families (the English-counted maps cover
# Latin-script European languages better than Cyrillic or CJK).
# (Vim's French catalog declares a charset its header does not use, which gettext refuses: Italian instead.)
LANGUAGES = {"de": "German", "es": "Spanish", "it": "Italian", "ru": "Russian", "ja": "Japanese",
             "zh_CN.UTF-8": "Chinese", "pl": "Polish", "tr": "Turkish"}
CATALOG_GLOB = "/usr/share/vim/vim*/lang/{lang}/LC_MESSAGES/vim.mo"
TEMPLATE = ("Here are user-interface messages of a text editor in {language}. Continue the list with more such "
            "messages in {language}, one per line. Reply in {language} only.\n\n{messages}\n")
MESSAGES_PER_PROMPT = 40
MIN_CHARS = 20  # messages shorter than this are mostly labels ("Hostname: ")
DEFAULT_MULTILINGUAL_PROMPTS = 16


def catalog_messages(lang: str, pattern: str = CATALOG_GLOB) -> list[str]:
    """The translated messages of one catalog, one line each, in msgid order (empty if it is not installed)."""
    paths = sorted(glob.glob(pattern.format(lang=lang)))
    if not paths:
        return []
    try:
        with open(paths[-1], "rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr; the header's msgid is ""
    except (OSError, UnicodeDecodeError) as e:
        raise FrspecError(f"cannot read the message catalog {paths[-1]}: {e}") from None
    out = []
    for msgid, text in sorted(((k, v) for k, v in catalog.items() if isinstance(k, str) and k),
                              key=lambda kv: kv[0]):
        line = " ".join(str(text).split())
        if len(line) >= MIN_CHARS:
            out.append(line)
    return out


def load_multilingual(num_prompts: int | None = None, pattern: str = CATALOG_GLOB,
                      languages: dict[str, str] = LANGUAGES) -> list[Prompt]:
    """Prompts in each installed language of `languages` (see the module docstring), round-robin over
    languages; all of them without num_prompts."""
    from frspec.bench.prompt import even_spread

    prompts = []
    for lang, language in languages.items():
        messages = catalog_messages(lang, pattern)
        for i in range(0, len(messages) - 2 * MESSAGES_PER_PROMPT + 1, 2 * MESSAGES_PER_PROMPT):
            shown = messages[i: i + MESSAGES_PER_PROMPT]
            following = messages[i + MESSAGES_PER_PROMPT: i + 2 * MESSAGES_PER_PROMPT]
            prompts.append(Prompt(id=f"lang-{lang.split('.')[0]}-{i // (2 * MESSAGES_PER_PROMPT)}",
                                  text=TEMPLATE.format(language=language, messages="\n".join(shown)),
                                  category=language, reference="\n".join(following)))
    if not prompts:
        where = Path(pattern.format(lang="LANG"))
        raise FrspecError(f"the multilingual prompts are Vim's message catalogs ({where}), none of which is "
                          "installed: apt-get install vim-runtime")
    return even_spread(prompts, num_prompts if num_prompts is not None else None)
