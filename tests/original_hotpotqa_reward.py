"""TEST-ONLY REFERENCE: the original MemAgent's answer extraction and HotpotQA training reward,
quoted from https://github.com/BytedTsinghua-SIA/MemAgent at commit
76b7a658988e4ea53d7388a62de6c0ce79084146, so the tests can compare our code with it on many
inputs. Nothing outside tests/ may import this file; with tests/original_memory_prompts.py and
tests/original_memory_eval/ it holds the only copies of the original's code in this repository.

Quoted verbatim (only the comments marked "[test note]" are ours, and one string literal
written with an escaped backslash, the same string):
- `verl/utils/reward_score/hotpotqa.py`: compute_score, is_equiv, remove_boxed,
  last_boxed_only_string, strip_string (the training reward);
- `taskutils/memory_eval/utils/__init__.py`: extract_solution, extract_boxed_answer (the
  evaluation's extraction; its last_boxed_only_string is byte for byte the one below);
- `taskutils/memory_eval/ruler_hqa.py`, lines 65-69 of get_pred, as `ruler_hqa_pred` (how the
  evaluation turns one final reply into the prediction it scores).
"""
# ruff: noqa
import os


# ---- verl/utils/reward_score/hotpotqa.py --------------------------------------------------

def compute_score(solution_str, ground_truth: list) -> float: 
    def compute_score_single(solution_str, ground_truth) -> float:
        ground_truth = ground_truth.lower()

        retval = 0.
        try:
            string_in_last_boxed = last_boxed_only_string(solution_str)
            if string_in_last_boxed is not None:
                answer = remove_boxed(string_in_last_boxed)
                if is_equiv(answer, ground_truth):
                    retval = 1.
        except Exception as e:
            print(e)
        return retval
    solution_str = solution_str[-300:].lower()
    return max(compute_score_single(solution_str, gt) for gt in ground_truth)


# string normalization from https://github.com/EleutherAI/lm-evaluation-harness/blob/master/lm_eval/tasks/hendrycks_math.py
def is_equiv(str1, str2, verbose=False):
    if str1 is None and str2 is None:
        print("WARNING: Both None")
        return True
    if str1 is None or str2 is None:
        return False

    try:
        ss1 = strip_string(str1)
        ss2 = strip_string(str2)
        if verbose:
            print(ss1, ss2)
        return ss1 == ss2
    except Exception:
        return str1 == str2


def remove_boxed(s):
    if "\\boxed " in s:
        left = "\\boxed "
        assert s[:len(left)] == left
        return s[len(left):]

    left = "\\boxed{"

    assert s[:len(left)] == left
    assert s[-1] == "}"

    return s[len(left):-1]


def last_boxed_only_string(string):
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None

    i = idx
    right_brace_idx = None
    num_left_braces_open = 0
    while i < len(string):
        if string[i] == "{":
            num_left_braces_open += 1
        if string[i] == "}":
            num_left_braces_open -= 1
            if num_left_braces_open == 0:
                right_brace_idx = i
                break
        i += 1

    if right_brace_idx is None:
        retval = None
    else:
        retval = string[idx:right_brace_idx + 1]

    return retval

def strip_string(string):
    # linebreaks
    string = string.replace("\n", "")

    # remove inverse spaces
    string = string.replace("\\!", "")

    # replace \\ with \
    string = string.replace("\\\\", "\\")

    # replace tfrac and dfrac with frac
    string = string.replace("tfrac", "frac")
    string = string.replace("dfrac", "frac")

    # remove \left and \right
    string = string.replace("\\left", "")
    string = string.replace("\\right", "")

    # Remove circ (degrees)
    string = string.replace("^{\\circ}", "")
    string = string.replace("^\\circ", "")

    # remove dollar signs
    string = string.replace("\\$", "")

    # remove percentage
    string = string.replace("\\%", "")
    # [test note] the original writes "\%" with one backslash (an invalid escape that
    # Python keeps as backslash-percent); written escaped here so Python does not warn
    string = string.replace("\\%", "")

    # " 0." equivalent to " ." and "{0." equivalent to "{." Alternatively, add "0" if "." is the start of the string
    string = string.replace(" .", " 0.")
    string = string.replace("{.", "{0.")
    # if empty, return empty string
    if len(string) == 0:
        return string
    # remove spaces
    string = string.replace(" ", "")

    return string


# ---- taskutils/memory_eval/utils/__init__.py ----------------------------------------------

def extract_solution(solution_str):
    """Extracts the final answer from the model's response string.
    
    Args:
        solution_str: Raw response string from the language model
        
    Returns:
        Tuple containing (extracted_answer, processed_string)
    """
  
    # Extract final answer using XML-style tags
    if "</think>" not in solution_str:
        if not os.environ.get("FORCE_THINK"):
            return solution_str, solution_str
        else:
            print("[Error] No valid answer tags found")
            return None, solution_str 
    final_answer = solution_str.split("</think>")[-1].strip()
    return final_answer, solution_str


def extract_boxed_answer(string):
    s = last_boxed_only_string(string)
    if s is None:
        return None
    else:
        if "\\boxed " in s:
            left = "\\boxed "
            assert s[:len(left)] == left
            return s[len(left):]

        left = "\\boxed{"

        assert s[:len(left)] == left
        assert s[-1] == "}"

        return s[len(left):-1]


# ---- taskutils/memory_eval/ruler_hqa.py, get_pred (recurrent-boxed and boxed) -------------

def ruler_hqa_pred(output):
    # [test note] `extract_answer` is extract_boxed_answer under --api recurrent-boxed / boxed
    extract_answer = extract_boxed_answer
    response = output.strip()
    pred, _ = extract_solution(response)
    return extract_answer(pred) if pred else extract_answer(response)
