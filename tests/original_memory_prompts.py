"""TEST-ONLY REFERENCE: how the original MemAgent's trainer builds its prompts, quoted from
https://github.com/BytedTsinghua-SIA/MemAgent at commit
76b7a658988e4ea53d7388a62de6c0ce79084146, so the tests can compare our prompts with the ids the
original would build. Nothing outside tests/ may import this file; with
tests/original_hotpotqa_reward.py and tests/original_memory_eval/ it holds the only copies of
the original's code in this repository.

Quoted verbatim:
- `recurrent/impls/memory.py`: TEMPLATE, TEMPLATE_FINAL_BOXED (the two messages);
- `recurrent/utils.py`: TokenTemplate, chat_template, unpad (the id splicing, the chat
  wrapper, and how a reply becomes the next memory).
"""
# ruff: noqa
import re
from typing import List

import numpy as np
import torch
from transformers import PreTrainedTokenizer


# ---- recurrent/impls/memory.py -------------------------------------------------------------

TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""

TEMPLATE_FINAL_BOXED = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""


# ---- recurrent/utils.py -------------------------------------------------------------------

class TokenTemplate:
    """
    format string, but in token_ids, use torch.LongTensor as data type.
    Input value can also be nunpy.ndarray or list[int].

    usage:
    ```
    TEMPLATE = "Here is a problem: {problem}"
    "Given this section: {section}"
    "Please answer it."

    processor = TokenTemplate(TEMPLATE, tokenizer)

    kwarg_text = dict(
        problem="What is the capital of France?",
        section="Here is a introduction to France. France is a country in Western Europe. Its capital is Paris.",
    )
    kwargs_token_ids = {
        k: tokenizer.encode(v, add_special_tokens=False) for k, v in kwarg_text.items()
    }

    print(tokenizer.decode(processor.format(**kwargs_token_ids)))

    # just as a text format string.
    assert TEMPLATE.format(**kwarg_text) == tokenizer.decode(processor.format(**kwargs_token_ids))
    ```
    """

    def __init__(self, template: str, tokenizer: PreTrainedTokenizer=None):
        self.template = template
        self.initialized = False
        if tokenizer:
            self.init(tokenizer)
        
    def init(self, tokenizer):
        self.keywords: list[str] = []  # Store extracted {keywords}
        self.token_sections: list[torch.LongTensor] = []  # Store tokenized text sections as LongTensors
        self.last_section: torch.LongTensor = None  # Last section as LongTensor
        
        # Match all {keywords}
        pattern = r'\{([a-zA-Z]+)\}'        
        parts = re.split(pattern, self.template)
        
        # Split text: even indices are non-{} parts, odd indices are {} keywords
        for i, part in enumerate(parts[:-1]):
            if i % 2 == 0:  # Even index, non-{} part
                tokens = tokenizer.encode(part, add_special_tokens=False)
                self.token_sections.append(torch.tensor(tokens, dtype=torch.long))
            else:  # Odd index, {} keyword
                self.keywords.append(part)
        self.last_section = torch.tensor(tokenizer.encode(parts[-1], add_special_tokens=False), dtype=torch.long)
        
        assert len(self.keywords) == len(self.token_sections), \
            f"{self.keywords} and {self.token_sections} should have the same length"
        self.initialized = type(tokenizer)

    @property
    def length(self) -> int:
        """
        Length of the template in token numbers
        """
        total = sum(section.numel() for section in self.token_sections)
        total += self.last_section.numel()
        return total

    def format(self, **kwargs: dict[str, torch.LongTensor | list[int] | np.ndarray]) -> torch.LongTensor:
        """
        Format the template with provided token ids
        
        Args:
            **kwargs: Dictionary of keyword to token ids (as LongTensor)
            
        Returns:
            Concatenated token ids as LongTensor
        """
        # Initialize with first section if exists
        formatted_parts = []
        
        # Reconstruct template by interleaving sections and keyword tokens
        for i, k in enumerate(self.keywords):
            if isinstance(kwargs[k], list):
                kwargs[k] = torch.tensor(kwargs[k], dtype=torch.long)
            elif isinstance(kwargs[k], np.ndarray):
                kwargs[k] = torch.from_numpy(kwargs[k]).to(torch.long)
            formatted_parts.append(self.token_sections[i])
            formatted_parts.append(kwargs[k])
        formatted_parts.append(self.last_section)
        
        return torch.cat(formatted_parts)

def chat_template(tokenizer, system=False) -> str:
    if system:
        return tokenizer.apply_chat_template([{'role':'system','content':'{system}'},
                                              {'role':'user','content':'{message}'}],
                                                    add_generation_prompt=True,
                                                    tokenize=False)
    else:
        return tokenizer.apply_chat_template([{'role':'user','content':'{message}'}],
                                                    add_generation_prompt=True, 
                                                    tokenize=False)

def unpad(tokenizer, tensor: torch.Tensor, remove_eos: bool = False) -> List[torch.Tensor]:
    """Unpad tensor. Remove eos if specified"""
    if len(tensor.shape) == 1:
        tensor = tensor.unsqueeze(0) 
    attention_mask = ~(tensor == tokenizer.pad_token_id)
    if remove_eos:
        attention_mask &= ~(tensor == tokenizer.eos_token_id)
    if tensor.shape[0] == 1:
        arr = np.empty(1, dtype=object)
        arr[0] = tensor[0][attention_mask[0].bool()]
        return arr
    
    return np.array([tensor[i][attention_mask[i].bool()] for i in range(tensor.shape[0])], dtype=object)
