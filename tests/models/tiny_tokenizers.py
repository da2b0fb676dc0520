"""Tiny Hugging Face tokenizers in four chat styles, built offline with the
`tokenizers` library and written the way checkpoints ship them
(tokenizer.json, tokenizer_config.json, chat_template.jinja). Importing
this module never imports transformers.

- llama3: the template writes <|begin_of_text|>; the post-processor in
  tokenizer.json adds it to plain text; tools as indented JSON.
- gemma: the template writes {{ bos_token }}; the post-processor adds
  <bos>; tokenizer_config.json also says add_bos_token, which transformers
  ignores beside a tokenizer.json.
- qwen3: ChatML with no BOS at all, <tools>, tool responses and the
  enable_thinking switch.
- chatml_bos: ChatML whose bos_token is <|im_start|> itself: adding a BOS to
  the rendered text would double the first turn's opener. No post-processor
  in tokenizer.json (plain text gets no specials).
"""

import json
import os

import tokenizers

CORPUS = ['The quick brown fox jumps over the lazy dog.',
          'What is 12 + 30? The answer is 42.',
          'Paris is the capital of France; Rome is the capital of Italy.',
          'def add(a, b):\n    return a + b  # sums <a> & <b>',
          'The weather in Paris is sunny, 21 degrees.'] * 40

LLAMA3 = """{{- '<|begin_of_text|>' }}
{%- if messages[0]['role'] == 'system' %}
{%- set system = messages[0]['content'] | trim %}
{%- set messages = messages[1:] %}
{%- else %}
{%- set system = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{{- 'Year: ' + strftime_now('%Y') + '\\n' }}
{%- if tools %}
{{- 'Call a function by answering {\"name\": ..., \"parameters\": ...}.\\n' }}
{%- for tool in tools %}
{{- tool | tojson(indent=2) + '\\n' }}
{%- endfor %}
{%- endif %}
{{- system + '<|eot_id|>' }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
{%- if message['role'] == 'assistant' %}
{%- generation %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}
{%- else %}
{{- message['content'] | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA = """{{ bos_token }}
{%- set first = namespace(system='') %}
{%- for message in messages %}
{%- if message['role'] == 'system' %}
{%- set first.system = message['content'] + '\\n\\n' %}
{%- elif message['role'] in ['user', 'assistant', 'model'] %}
{%- set role = 'model' if message['role'] != 'user' else 'user' %}
{{- '<start_of_turn>' + role + '\\n' }}
{%- if role == 'user' and first.system %}{{ first.system }}{% set first.system = '' %}{% endif %}
{%- if role == 'user' and loop.first and tools %}
{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}
{%- endif %}
{{- message['content'] | trim }}{{ '<end_of_turn>\\n' }}
{%- else %}
{{- raise_exception('roles are user, model, assistant and system') }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}
"""

QWEN3 = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\nCall as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant') %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

CHATML = """{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""

STYLES = {
    'llama3': dict(
        template=LLAMA3,
        specials=['<|begin_of_text|>', '<|end_of_text|>',
                  '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'],
        config=dict(bos_token='<|begin_of_text|>', eos_token='<|eot_id|>'),
        post_processor=lambda ids: tokenizers.processors.TemplateProcessing(
            single='<|begin_of_text|> $A',
            pair='<|begin_of_text|> $A <|begin_of_text|> $B:1',
            special_tokens=[('<|begin_of_text|>', ids['<|begin_of_text|>'])])),
    'gemma': dict(
        template=GEMMA,
        specials=['<pad>', '<eos>', '<bos>', '<unk>', '<start_of_turn>',
                  '<end_of_turn>'],
        config=dict(bos_token='<bos>', eos_token='<eos>', pad_token='<pad>',
                    unk_token='<unk>', add_bos_token=True,
                    add_eos_token=False),
        post_processor=lambda ids: tokenizers.processors.TemplateProcessing(
            single='<bos> $A', pair='<bos> $A $B:1',
            special_tokens=[('<bos>', ids['<bos>'])])),
    'qwen3': dict(
        template=QWEN3,
        specials=['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
        config=dict(bos_token=None, eos_token='<|im_end|>',
                    pad_token='<|endoftext|>'),
        post_processor=lambda ids: tokenizers.processors.ByteLevel(
            trim_offsets=False)),
    'chatml_bos': dict(
        template=CHATML,
        specials=['<|im_start|>', '<|im_end|>'],
        config=dict(bos_token='<|im_start|>', eos_token='<|im_end|>'),
        post_processor=None),
}


# Gemma 3's image tokens, named in tokenizer_config.json as its processor
# looks them up.
IMAGE_TOKENS = {'boi_token': '<start_of_image>',
                'eoi_token': '<end_of_image>',
                'image_token': '<image_soft_token>'}
GEMMA3_VISION = dict(
    STYLES['gemma'], specials=STYLES['gemma']['specials'] +
    list(IMAGE_TOKENS.values()),
    config=dict(STYLES['gemma']['config'], extra_special_tokens=IMAGE_TOKENS))


def make(style: str, directory: str) -> str:
  """Writes the tokenizer of `style` (or 'gemma3_vision') into
  `directory`; returns it."""
  spec = GEMMA3_VISION if style == 'gemma3_vision' else STYLES[style]
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(
      vocab_size=320, special_tokens=spec['specials'],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  if spec['post_processor']:
    tok.post_processor = spec['post_processor'](tok.get_vocab())
  os.makedirs(directory, exist_ok=True)
  tok.save(os.path.join(directory, 'tokenizer.json'))
  config = dict(tokenizer_class='PreTrainedTokenizerFast',
                model_max_length=4096, **spec['config'])
  with open(os.path.join(directory, 'tokenizer_config.json'), 'w') as f:
    json.dump(config, f, indent=2)
  with open(os.path.join(directory, 'chat_template.jinja'), 'w') as f:
    f.write(spec['template'])
  return directory


WEATHER = {'type': 'function', 'function': {
    'name': 'get_weather',
    'description': 'Weather in a city; "<unit>" & \'format\' are optional.',
    'parameters': {'type': 'object', 'properties': {
        'city': {'type': 'string', 'description': 'e.g. Paris'},
        'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit']}},
                   'required': ['city']}}}

# (name, messages, tools, template switches): what every style renders.
CHATS = [
    ('user', [{'role': 'user', 'content': 'What is the capital of France?'}],
     None, {}),
    ('system', [{'role': 'system', 'content': 'Be brief & exact.'},
                {'role': 'user', 'content': ' What is 12 + 30? '}], None, {}),
    ('multi_turn', [
        {'role': 'system', 'content': 'You add numbers.'},
        {'role': 'user', 'content': 'What is 12 + 30?'},
        {'role': 'assistant', 'content': 'The answer is 42.'},
        {'role': 'user', 'content': 'And 42 + 1? <b>bold</b> café'}],
     None, {}),
    ('tools', [{'role': 'user', 'content': 'Weather in Paris?'}], [WEATHER],
     {}),
]
QWEN_CHATS = [
    ('tool_response', [
        {'role': 'user', 'content': 'Weather in Paris?'},
        {'role': 'assistant', 'content': '<tool_call>\n{"name": '
                                         '"get_weather", "arguments": '
                                         '{"city": "Paris"}}\n</tool_call>'},
        {'role': 'tool', 'content': '{"temperature": 21}'}], [WEATHER], {}),
    ('no_thinking', [{'role': 'user', 'content': 'Hi'}], None,
     {'enable_thinking': False}),
]
TEXTS = ['What is the capital of France?', 'Hello  world\n  two spaces',
         'emoji 🙂 and ünïcödé', '<|im_start|>user', '']


def chats(style: str):
  return CHATS + (QWEN_CHATS if style == 'qwen3' else [])
