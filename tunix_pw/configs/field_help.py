"""Every config field's help, keyed by its path with its block normalised
(configs/reference.py's `_scope`); `job:field` where a job means something
else by it. `--print_config` and docs/reference.md show them."""

HELP: dict[str, str] = {
    # The job.
    'job': 'The job that runs (tunix_pw/jobs/); set by the config file.',
    'stages': "A pipeline's jobs in order, each configured by the block of "
              'its name; a stage starts from the previous one\'s model.',
    'seed': 'Seeds parameter init, data order and sampling.',
    'steps': 'Optimizer steps (RL: rollout-and-update steps).',
    'batch_size': 'Sequences (pairs, for dpo and reward_model) per step.',
    'pairs:batch_size': 'Prompts per generate call.',
    'generate:batch_size': 'Prompts per generate call.',
    'eval:batch_size': 'Held-out problems per generate call.',
    'data:batch_size': 'Examples per batch the pipeline makes.',
    'smoke:batch_size': 'Rows of the synthetic batch.',
    'micro_batches': 'Gradient accumulation: the step\'s batch runs in this '
                     'many equal parts, one optimizer update.',
    'learning_rate': "The smoke loop's SGD step size.",
    'logits_chunk': 'Positions whose logits the loss (and a reference\'s '
                    'log-probabilities) hold at once: [tokens, vocab] never '
                    'exists whole; 0: about 128 MiB per row, by vocabulary.',
    'distill:logits_chunk': 'The logit strategy\'s divergence too (the '
                            "teacher's outputs cut alike); must be 0 for "
                            'the attention and feature strategies.',
    'log_every': 'Steps between metric lines on the console and in '
                 'metrics.jsonl / TensorBoard.',
    'eval_every': 'Steps between held-out evaluations; 0: at the start '
                  '(RL) and the end only.',
    'eval_examples': 'Held-out problems per evaluation (per dataset of a '
                     'mixture).',
    'eval_batch_size': 'Held-out problems per generate call.',
    'eval_max_new_tokens': 'Tokens a held-out completion may take.',
    'eval_verifier': 'How a held-out completion is judged: exact_answer '
                     '(its last number), math_equal or exact (the whole '
                     "text); '' (RL): math_equal where rl.rewards uses it, "
                     'else exact_answer.',
    'eval_k': 'pass@k and maj@k at this k beside greedy accuracy (0: '
              'greedy only).',
    'eval_n': 'Samples per problem for pass@k (unbiased estimator), at '
              'least eval_k; 0: eval_k.',
    'eval_temperature': 'Sampling temperature of the pass@k samples.',
    'stop_at_accuracy': 'Stop once an evaluation reaches this held-out '
                        'accuracy (0: off).',
    'sample_every': 'Steps between sample logs to samples.jsonl (0: off).',
    'samples_per_log': 'Prompts per sample log, each with all its '
                       'completions and rewards.',
    'export': "A directory: the final model and tokenizer in Hugging Face's "
              "layout ('' : none).",
    'reward_model:export': 'A directory: the reward model as a Hugging Face '
                           'sequence classifier (one label).',
    # eval, generate, pairs, data.
    'split': 'The split read: train or test.',
    'mode': "exact_match (greedy completions, judged by `verifier`) or "
            "loss (the reference completions' NLL).",
    'verifier': "exact_match's judge: exact_answer, math_equal or exact.",
    'examples': 'Problems evaluated.',
    'k': 'pass@k and maj@k at this k beside greedy accuracy (0: greedy '
         'only).',
    'n': 'Samples per problem for pass@k (unbiased estimator), at least k; '
         '0: k.',
    'eval:temperature': 'Sampling temperature of the pass@k samples.',
    'max_new_tokens': 'Tokens a completion may take.',
    'prompt': 'One prompt to sample.',
    'prompts_file': 'Prompts to sample: one per line, or JSONL with '
                    '"prompt" or "messages" (and "images": paths relative '
                    'to the file or data: URIs, one <start_of_image> '
                    'marker each).',
    'images.max_per_record': 'Images a data record may have.',
    'images.max_pixels': "An image's most pixels (width x height), read "
                         'from its header before it is decoded.',
    'images.max_bytes': "An image file's (or data: URI's) most bytes.",
    'images.pan_and_scan': "Gemma 3's pan and scan: a long image also "
                           'goes in as crops along its long side.',
    'chat': "Wrap prompts in the tokenizer's chat template.",
    'output_jsonl': 'A file for the tokens and log-probabilities of each '
                    "prompt ('' : print only).",
    'format': 'pairs (chosen/rejected, for DPO and reward models) or '
              'unpaired (labelled completions, for KTO).',
    'samples': 'Completions sampled per prompt.',
    'train_prompts': 'Prompts sampled from the train split.',
    'test_prompts': 'Prompts sampled from the test split.',
    'output_dir': 'Receives train.jsonl and test.jsonl.',
    'tokenizer': "A directory with tokenizer.json or tokenizer.model, or "
                 "'char' (built in).",
    'max_batches': 'Batches read (0: one epoch).',
    'dump': 'Write the example indices each process read.',
    # The model block.
    'model.preset': 'A name from tunix_pw/models/presets.py: the '
                    'architecture (Kaggle checkpoints need it; Hugging Face '
                    'ones bring their own config).',
    'model.checkpoint': 'A Hugging Face or Kaggle checkpoint directory, or a '
                        "tunix_pw workdir (its newest checkpoint); '': random "
                        'init from the preset.',
    'model.tokenizer': "A directory with tokenizer.json or tokenizer.model, "
                       "or 'char'; '': the checkpoint's, else 'char'.",
    'model.param_dtype': 'Stored parameters: float32 or bfloat16 (the '
                         'optimizer state follows unless '
                         'optimizer.state_dtype says otherwise).',
    'model.dtype': 'Compute dtype of activations: float32 or bfloat16.',
    'model.scan': 'Run the layers as a scan over stacked parameters (one '
                  'compiled layer however deep the model); False unrolls.',
    'model.unroll_cpu_train': 'On CPU devices the train step unrolls the '
                              'layers anyway (faster there).',
    'model.remat': 'Rematerialisation of each layer in the backward pass: '
                   'none, full, dots or dots_no_batch.',
    'model.pipeline_microbatches': 'With a stage mesh axis: the micro-'
                                   'batches a pipelined pass splits its rows '
                                   'into (at least the stages; the bubble is '
                                   '(stages - 1) / (this + stages - 1)).',
    # The optimizer block.
    'optimizer.name': 'adamw or sgd.',
    'optimizer.learning_rate': 'Peak learning rate.',
    'optimizer.warmup_steps': 'Linear warmup from 0 over this many steps.',
    'optimizer.schedule': 'After warmup: constant or cosine decay.',
    'optimizer.decay_steps': "Cosine decay's length (0: the run's steps).",
    'optimizer.end_fraction': "Cosine decay's final learning rate, as a "
                              'fraction of the peak.',
    'optimizer.b1': "AdamW's first-moment decay.",
    'optimizer.b2': "AdamW's second-moment decay.",
    'optimizer.eps': "AdamW's epsilon.",
    'optimizer.weight_decay': 'Decoupled weight decay.',
    'optimizer.clip_norm': 'Clip gradients to this global norm (0: off).',
    'optimizer.state_dtype': "The optimizer's state and arithmetic: '' "
                             "(the parameters' dtype) or float32 (for "
                             'bfloat16 parameters).',
    'optimizer.max_nonfinite_steps': 'A step with a non-finite loss or '
                                     'gradient norm is skipped; this many in '
                                     'a row stop the run.',
    # LoRA.
    'lora.rank': 'LoRA adapters of this rank (0: off, full fine-tuning).',
    'lora.alpha': "LoRA's scale numerator (the update is alpha/rank x BA).",
    'lora.quantize': "'int8' keeps the frozen base in int8 (QLoRA); '': as "
                     'stored.',
    'lora.targets': 'A regular expression over parameter paths: the '
                    'weights that get adapters (a vision tower\'s paths '
                    'start with vision/).',
    # Data.
    'data.name': 'The dataset: arithmetic or bars (built in; bars has '
                 'images), gsm8k, preferences, chat or code (JSONL in '
                 'manual_dir; docs/data.md).',
    'data.data_dir': 'Where built datasets are cached (TFDS).',
    'data.manual_dir': "A directory with the JSONL dataset's train.jsonl and "
                       'test.jsonl.',
    'data.on_bad_line': "'error' stops at a bad JSONL line, naming file and "
                        "line; 'skip' counts and skips it.",
    'data.max_length': 'Tokens per training sequence.',
    'data.overlong': 'A longer sequence is truncated or dropped (counted '
                     'either way).',
    'data.chat': "Render prompts through the tokenizer's chat template.",
    'data.packing': 'Pack SFT sequences into rows of max_length (segment '
                    'ids keep them apart).',
    'data.train_examples': 'Train on the first N examples of the train '
                           'split only (0: all).',
    'data.arithmetic.digits': 'Digits per operand.',
    'data.arithmetic.operations': "Operators drawn from: '+', '-', '*'.",
    'data.arithmetic.train_size': 'Training problems.',
    'data.arithmetic.test_size': 'Held-out problems (disjoint from '
                                 'training).',
    'data.arithmetic.seed': 'Seed of the problems.',
    'mixture.NAME.weight': "The dataset's share of the prompts, by weight.",
    'mixture.NAME.rewards': "The dataset's rewards (rl.rewards' grammar).",
    # Checkpoints.
    'checkpoint.every': 'Steps between checkpoints (0: only the last and '
                        'on preemption).',
    'checkpoint.keep': 'Checkpoints kept.',
    'checkpoint.async_save': 'Write checkpoints in the background while '
                             'training goes on.',
    # The runtime.
    'runtime.host_device_count': 'Virtual CPU devices for the whole job on '
                                 "CPU (split over processes); 0: JAX's "
                                 'default. Ignored on TPU.',
    'runtime.compilation_cache_dir': "Persistent XLA compilation cache ('': "
                                     'off); a bucket path on a cluster.',
    'runtime.max_inflight': 'Dispatched steps (and transfer groups) in '
                            'flight at most.',
    'runtime.reshard_group_mib': 'Bytes a weight transfer stages at once, '
                                 'in MiB.',
    'runtime.peer_timeout_s': 'Multi-controller: seconds processes wait for '
                              'a peer before the job ends with an error.',
    'runtime.progress_every_s': 'Outside a terminal (a log), seconds '
                                'between progress lines.',
    'runtime.profile_steps': "A profiler trace of these steps ('5', '5:8') "
                             "to <workdir>/profile; '': none.",
    'runtime.elastic.min_slices': 'Pathways: keep running through slice '
                                  'losses on at least this many healthy '
                                  'slices (0: off).',
    'runtime.elastic.poll_s': 'Seconds between slice health checks.',
    'runtime.elastic.timeout_s': 'Exit 42 after this long without enough '
                                 'slices (0: no limit).',
    'runtime.elastic.max_attempts': 'Exit 42 after this many attempts.',
    # Meshes and sharding.
    'meshes.layout': 'collocated (roles may share devices) or '
                     'disaggregated (each role on its own devices).',
    'meshes.ROLE.axes': "The role's mesh axes, e.g. 'fsdp=4,tp=2' (-1: the "
                        'rest); data, fsdp, tp.',
    'meshes.ROLE.devices': "The role's devices: 'all', '0:4', '50%:100%', "
                           "or another role's name (the same devices).",
    'sharding.batch': 'Mesh axes the batch dimension splits over.',
    'sharding.length': 'Mesh axes the tokens of activations split over '
                       '(sequence parallelism: keys and values are gathered '
                       'whole for attention).',
    'sharding.layers': 'Mesh axes the stacked layers split over (pipeline '
                       'stages: a pass without a cache runs them as a '
                       'pipeline).',
    'sharding.embed': 'Mesh axes the embedding dimension splits over.',
    'sharding.mlp': 'Mesh axes the MLP hidden dimension splits over.',
    'sharding.heads': 'Mesh axes attention heads split over.',
    'sharding.kv_heads': 'Mesh axes key/value heads split over.',
    'sharding.vocab': 'Mesh axes the vocabulary splits over.',
    # RL.
    'rl.variant': 'The GRPO-family variant whose settings the block '
                  'started from (informative).',
    'rl.num_generations': 'Completions per prompt (G, the group).',
    'rl.prompts_per_step': 'Prompts per step.',
    'rl.mini_batch_size': 'Samples per optimizer update.',
    'rl.micro_batch_size': 'Samples per gradient pass.',
    'rl.logps_micro_batch_size': 'Samples per log-probability pass (old '
                                 'policy, reference, critic).',
    'rl.num_iterations': 'Updates per rollout (importance ratios when > 1).',
    'rl.rewards': "Weighted rewards, 'name:weight,...' (registered in "
                  'rl/rewards.py; reward_model and judge too).',
    'rl.strict_rewards': 'A reward that raises stops the run (else it '
                         'scores 0 and is counted).',
    'rl.refill_rounds': 'Dynamic sampling: prompt batches drawn to replace '
                        'groups with no signal.',
    'rl.max_prompt_length': 'Prompt tokens at most (longer prompts are '
                            'dropped and counted).',
    'rl.max_new_tokens': 'Tokens a completion may take.',
    'rl.tree.chains': 'Tree rollouts: chains per prompt decoded from the '
                      'prompt (0: independent chains and the group '
                      'advantage; sampling/tree.py).',
    'rl.tree.segment': 'Tree rollouts: tokens between branch points.',
    'rl.tree.branches': 'Tree rollouts: live chains per prompt that fork at '
                        'a branch point (the most uncertain: highest mean '
                        '-log p over the last segment).',
    'rl.tree.forks': 'Tree rollouts: new chains each forking one starts '
                     '(into unused rows of the prompt\'s num_generations).',
    'rl.tree.local_weight': "Tree advantage: weight of V(node) - V(parent).",
    'rl.tree.global_weight': "Tree advantage: weight of V(node) - V(root).",
    'rl.tree.by_leaves': 'Tree advantage: divided by sqrt(the leaves that '
                         'share the token).',
    'rl.logits_chunk': 'Positions whose logits the log-probability passes '
                       '(on-policy distillation\'s teacher\'s too) and the '
                       'loss hold at once (the [tokens, vocab] logits never '
                       'exist whole); 0: about 128 MiB per row, by '
                       'vocabulary.',
    'rl.temperature': 'Sampling temperature; every log-probability is of '
                      'the tempered policy.',
    'rl.top_p': 'Nucleus sampling (1: off).',
    'rl.top_k': 'Top-k sampling (0: off).',
    'rl.advantage': 'grpo, drgrpo, rloo, reinforce++, reinforce++-baseline, '
                    'on_policy_distill or gae (rl/functions.py).',
    'rl.policy_loss': 'ppo_clip, gspo_token or cispo.',
    'rl.eps_low': "The ratio's lower clip (1 - eps_low).",
    'rl.eps_high': "The ratio's upper clip (1 + eps_high).",
    'rl.aggregation': 'token-mean, sequence-mean-token-mean or '
                      'sequence-mean-token-scale.',
    'rl.kl': "The KL estimator against the reference: k1, k2 or k3.",
    'rl.kl_beta': "The KL term's weight (0: no reference model).",
    'rl.dynamic_sampling': 'Replace groups whose rewards are all equal '
                           '(DAPO).',
    'rl.tis_cap': 'Truncated importance weights min(pi_old / pi_rollout, '
                  "cap) on each token's loss (0: off).",
    'rl.mismatch_metrics': "mismatch/* metrics: the rollout engine's "
                           "log-probabilities against the trainer's.",
    'rl.mis_threshold': 'Masked importance sampling: sequences whose '
                        'pi_old / pi_rollout exceeds it are masked (0: off).',
    'rl.is_level': "TIS's and MIS's ratio: token, sequence or geomean; '': "
                   'TIS per token, MIS per sequence.',
    'rl.is_low': 'The lower threshold: TIS clips up to it, MIS masks below '
                 'it.',
    'rl.max_staleness': 'Asynchronous RL: rollouts from a policy at most '
                        'this many steps old (0: synchronous).',
    'rl.decode_chunk': 'Partial rollouts: tokens per decode call, newest '
                       'weights between calls (0: one call).',
    'rl.reward_model': "A reward model (the reward_model job's export); "
                       "name it in rl.rewards ('reward_model:1').",
    'rl.judge': 'An LLM judge: a checkpoint or trained workdir; name it in '
                "rl.rewards ('judge:1').",
    'rl.judge_chat': "Wrap the judge's asks in its chat template.",
    'rl.judge_max_new_tokens': "Tokens of the judge's answer.",
    'rl.judge_max_prompt_length': 'Ask tokens the judge reads at most; a '
                                  'longer ask scores judge_malformed.',
    'rl.judge_scale': "The judge's first number over this is the reward.",
    'rl.judge_malformed': 'The reward of an answer with no number in [0, '
                          'judge_scale].',
    'rl.judge_template': "The judge's ask, with {prompt} and {completion}.",
    'rl.gamma': "GAE's discount.",
    'rl.lam': "GAE's lambda.",
    'rl.whiten_advantages': 'Normalise advantages over the batch.',
    'rl.entropy_coef': "The entropy bonus's weight.",
    'rl.kl_in_reward': 'The KL penalty goes into the per-token reward '
                       '(False: a loss term).',
    # PPO's critic.
    'critic.init': "'policy' (the policy's initial model) or 'model' "
                   '(critic.model).',
    'critic.value_clip': "Clip the value update to this (0: unclipped).",
    'critic.warmup_steps': 'Steps that train the critic alone.',
    # Distillation (the distill job, and grpo's distill variant).
    'distill.strategy': 'logit, attention or feature.',
    'distill.divergence': 'forward_kl, reverse_kl or jsd.',
    'distill.beta': "jsd's mixture weight of the teacher.",
    'distill.temperature': 'Temperature of both distributions.',
    'distill.top_k': "The teacher's k largest logits only (0: all).",
    'distill.layers': "attention and feature: student:teacher layer pairs "
                      "('0:1,3:5'); '': each student layer with the "
                      "teacher's at its relative depth.",
    'distill.pooling': "feature: per 'token' or 'mean' per sequence.",
    'distill.weight': "The strategy's loss weight.",
    'distill.sft_weight': "The data's NLL weight.",
    'distill.token_weight': "On-policy: the sampled tokens' log-ratio "
                            'advantages\' weight.',
    # DPO.
    'dpo.algorithm': 'dpo, ipo, orpo or kto.',
    'dpo.beta': "The implicit reward's scale (IPO: its regulariser).",
    'dpo.orpo_lambda': "ORPO's odds-ratio term weight.",
    'dpo.kto_lambda_desirable': "KTO's weight of desirable examples.",
    'dpo.kto_lambda_undesirable': "KTO's weight of undesirable examples.",
    # Agents.
    'agent.env': 'A registered environment (agents/envs.py).',
    'agent.tools': 'Comma-separated registered tools.',
    'agent.verifier': 'How an answer is judged (the calculator and answer '
                      'environments): exact_answer (its last number), '
                      'math_equal or exact; its word on a wrong answer is '
                      'a retry\'s {feedback}.',
    'agent.call_format': 'Tool-call format: qwen, llama or gemma.',
    'agent.max_turns': 'Model turns per episode.',
    'agent.max_concurrent': 'Episodes in flight.',
    'agent.tool_timeout': 'Seconds per tool call.',
    'agent.episode_timeout': 'Seconds per episode.',
    'agent.failure_reward': "Added to an episode's rewards when it runs out "
                            'of time, turns or context.',
    'agent.malformed_reward': "A turn's reward for a call that does not "
                              'parse.',
    'agent.lockstep': 'Every turn waits for all tools (a baseline).',
    'agent.max_sandbox_failures': "A step with more than this share of "
                                  "groups whose sandbox could not start "
                                  "stops the job (exit 1).",
    'agent.attempts': 'Answers per episode (self-correction).',
    'agent.corrected_reward': 'The reward of a right answer after a wrong '
                              'one.',
    'agent.feedback': "What the model reads after a wrong answer ("
                      "{feedback}: the verifier's word).",
    'agent.practice': "The share of a step's problems that start from a "
                      'wrong first answer.',
    # generate and pairs.
    'sampling.max_new_tokens': 'Tokens a completion may take.',
    'sampling.temperature': 'Sampling temperature (0: greedy).',
    'sampling.top_k': 'Top-k sampling (0: off).',
    'sampling.top_p': 'Nucleus sampling (1: off).',
    'sampling.seed': 'Seed of the sampling keys.',
    'sampling.max_cache': "KV cache length (0: the model's max positions).",
}
