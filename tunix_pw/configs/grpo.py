"""GRPO and its variants: GRPO, DAPO, Dr. GRPO, GSPO-token, CISPO, REINFORCE++,
on-policy distillation.

  python -m tunix_pw.main --config=tunix_pw/configs/grpo.py:runlocal \
      --workdir=/tmp/grpo
  python -m tunix_pw.main --config=tunix_pw/configs/grpo.py:runlocal,dapo \
      --workdir=/tmp/dapo
  python -m tunix_pw.main --config=tunix_pw/configs/grpo.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b-it --config.data.name=gsm8k \
      --config.data.manual_dir=/data/gsm8k --workdir=/gcs/bucket/grpo

arg: `<model preset or runlocal>[,<variant>[,mix]]`, variant one of grpo,
dapo, drgrpo, gspo, cispo, reinforce++, distill (default grpo). A variant is only a set of the
registered functions and settings below; every field can be overridden.
`,mix` trains on a mixture of datasets, each with its own rewards (see
`mixture`).
"""

import ml_collections

from tunix_pw.configs import common

VARIANTS = {
    # DeepSeekMath GRPO: group-standardised advantages, clipped ratio, k3 KL.
    'grpo': dict(advantage='grpo', policy_loss='ppo_clip', eps_low=0.2,
                 eps_high=0.2, aggregation='sequence-mean-token-mean',
                 kl='k3', kl_beta=0.04, dynamic_sampling=False),
    # DAPO: clip-higher, token-mean, no KL, overlong shaping, dynamic
    # sampling.
    'dapo': dict(advantage='grpo', policy_loss='ppo_clip', eps_low=0.2,
                 eps_high=0.28, aggregation='token-mean', kl='k3',
                 kl_beta=0.0, dynamic_sampling=True,
                 rewards='exact_answer:1.0,format:0.1,overlong:0.5'),
    # Dr. GRPO: no std division, no length normalisation, no KL.
    'drgrpo': dict(advantage='drgrpo', policy_loss='ppo_clip', eps_low=0.2,
                   eps_high=0.2, aggregation='sequence-mean-token-scale',
                   kl='k3', kl_beta=0.0, dynamic_sampling=False),
    # GSPO-token: sequence-level ratios carried per token, tight clipping.
    'gspo': dict(advantage='grpo', policy_loss='gspo_token', eps_low=3e-4,
                 eps_high=4e-4, aggregation='sequence-mean-token-mean',
                 kl='k3', kl_beta=0.0, dynamic_sampling=False),
    # CISPO (MiniMax-M1): clipped, stopped importance weights on every
    # token's log-probability; no lower clip.
    'cispo': dict(advantage='grpo', policy_loss='cispo', eps_low=1.0,
                  eps_high=0.28, aggregation='token-mean', kl='k3',
                  kl_beta=0.0, dynamic_sampling=False),
    # REINFORCE++-baseline: group mean out, batch-normalised; PPO clip.
    'reinforce++': dict(advantage='reinforce++-baseline',
                        policy_loss='ppo_clip', eps_low=0.2, eps_high=0.2,
                        aggregation='token-mean', kl='k3', kl_beta=0.0,
                        dynamic_sampling=False),
    # On-policy distillation (Agarwal et al. 2024, GKD; Lu et al. 2025,
    # Thinking Machines): the student samples, a teacher (--config.teacher)
    # scores each sampled token; advantage log pi_T - log pi_S per token
    # (the negative per-token reverse KL), no reward needed (the rewards are
    # still computed and logged). The kl metric is then the k3 estimate of
    # KL(student || teacher).
    'distill': dict(advantage='on_policy_distill', policy_loss='ppo_clip',
                    eps_low=0.2, eps_high=0.2, aggregation='token-mean',
                    kl='k3', kl_beta=0.0, dynamic_sampling=False),
}


def rl_block(variant: str, local: bool) -> ml_collections.ConfigDict:
  block = dict(
      variant=variant,
      num_generations=8,  # G
      prompts_per_step=8 if local else 32,
      mini_batch_size=64 if local else 256,  # samples per optimizer update
      micro_batch_size=16 if local else 32,  # samples per gradient pass
      logps_micro_batch_size=32 if local else 64,
      num_iterations=1,  # updates per rollout (importance ratios when > 1)
      rewards='exact_answer:1.0,format:0.1',
      strict_rewards=False,  # a failing reward stops the run
      refill_rounds=2,  # DAPO: prompt batches drawn to replace dropped groups
      max_prompt_length=12 if local else 256,
      max_new_tokens=6 if local else 512,
      logits_chunk=0,  # positions per chunk of logits (0: by vocabulary)
      temperature=1.0, top_p=1.0, top_k=0,
      # The rollout engine's log-probabilities against the trainer's:
      # truncated importance weights min(pi_old / pi_rollout, tis_cap) on
      # every token's loss (0: off), and mismatch/* metrics (on with TIS).
      tis_cap=0.0, mismatch_metrics=False,
      # Masked importance sampling: each sequence's ratio pi_old /
      # pi_rollout (over its tokens) weights its loss; sequences above the
      # threshold are masked out (0: off; exclusive with tis_cap).
      mis_threshold=0.0,
      # TIS's and MIS's ratio: per token, per sequence (the product) or
      # its geometric mean; '': TIS per token, MIS per sequence. is_low:
      # the lower threshold (TIS clips up to it, MIS masks below it).
      is_level='', is_low=0.0,
      # Asynchronous RL (rl/asynchronous.py): rollouts generated ahead of
      # the update, from a policy at most this many steps old; 0: each
      # rollout waits for the previous step's weights (synchronous).
      max_staleness=0,
      # Tree rollouts (sampling/tree.py): each prompt's num_generations
      # rows grown as a tree, `chains` of them from the prompt and, after
      # every `segment` tokens, the `branches` most uncertain live chains
      # forking `forks` times into unused rows; the advantages are then
      # the tree's (TreeRL): local_weight x (V(node) - V(parent)) +
      # global_weight x (V(node) - V(root)), over sqrt(leaves) with
      # by_leaves. chains=0: independent chains, the group advantage.
      tree=ml_collections.ConfigDict(dict(
          chains=0, segment=2 if local else 16, branches=1,
          forks=3 if local else 2,
          local_weight=1.0, global_weight=1.0, by_leaves=True)),
      # Partial rollouts: decode this many tokens per call, taking the
      # newest weights between calls (0: the whole decode loop at once).
      decode_chunk=0,
      # A reward model (the reward_model job's export) scoring every
      # sample: name it in the rewards with a weight ('reward_model:1').
      reward_model='',
      # An LLM judge (rl/judge.py): a model (Hugging Face checkpoint or
      # trained workdir) that reads each sample through the template and
      # answers with a score; name it in the rewards ('judge:1').
      judge='', judge_chat=False, judge_max_new_tokens=8, judge_scale=10.0,
      judge_malformed=0.0,  # the reward of an answer with no usable score
      # The judge reads asks of up to this many tokens (one compiled
      # program); a longer one is not read and scores judge_malformed.
      judge_max_prompt_length=128 if local else 1024,
      judge_template=('Rate the answer from 0 to 10.\nQuestion: {prompt}\n'
                      'Answer: {completion}\nScore: '))
  block.update(VARIANTS[variant])
  return ml_collections.ConfigDict(block)


def mixture(local: bool) -> ml_collections.ConfigDict:
  """Two datasets mixed 3:1, each with its own rewards: 2-digit additions
  (exact answers) and 1-digit multiplications (partial credit per digit);
  or, on a cluster, GSM8K with arithmetic beside it."""
  first = (common.data('arithmetic') if local else common.data('gsm8k'))
  return ml_collections.ConfigDict(dict(
      add=dict(data=first, weight=3.0, rewards='exact_answer:1.0,format:0.1'),
      mul=dict(data=common.data('arithmetic', digits=1, operations='*',
                                train_size=60, test_size=21),
               weight=1.0, rewards='digits:1.0,format:0.1')))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  preset, _, variant = (arg or 'runlocal').partition(',')
  variant, _, mix = variant.partition(',')
  variant = variant or 'grpo'
  if variant not in VARIANTS or mix not in ('', 'mix'):
    raise ValueError(f'unknown variant {variant!r}{"," + mix if mix else ""};'
                     f' use one of {", ".join(VARIANTS)}, optionally '
                     'followed by ",mix"')
  local = preset in ('', 'runlocal')
  c = ml_collections.ConfigDict()
  c.job = 'grpo'
  c.seed = 0
  c.model = common.model('tiny-gemma' if local else preset)
  c.lora = common.lora()
  c.data = common.data('arithmetic' if local else 'gsm8k')
  # Datasets mixed by weight, each {data, weight, rewards} (`,mix` in the
  # config's arg); empty: the data block alone, scored by rl.rewards.
  c.mixture = mixture(local) if mix else ml_collections.ConfigDict()
  c.rl = rl_block(variant, local)
  if variant == 'distill':  # on-policy distillation's teacher
    c.teacher = common.model('tiny-gemma' if local else preset)
    # GKD's term (Agarwal et al. 2024): at each sampled position, weight x
    # a divergence of the teacher's and the student's whole next-token
    # distributions at a temperature (the teacher's top-k logits, or all),
    # beside token_weight x the sampled tokens' log-ratio advantages.
    c.distill = ml_collections.ConfigDict(dict(
        divergence='forward_kl', beta=0.5, temperature=2.0 if local else 1.0,
        top_k=0 if local else 64, weight=1.0, token_weight=1.0))
  c.optimizer = common.optimizer(learning_rate=1e-4 if local else 1e-6,
                                 warmup_steps=0, schedule='constant')
  c.steps = 20 if local else 500
  c.log_every = 1
  c.eval_every = 0  # 0: at the start and the end only
  c.eval_examples = 500  # per held-out set (a mixture has one per dataset)
  c.eval_batch_size = 100 if local else 64
  c.eval_k = 0  # pass@k and maj@k (0: greedy only)
  c.eval_n = 0  # samples per problem for pass@k, at least eval_k (0: k)
  # How a held-out completion is judged: exact_answer (its last number),
  # math_equal, exact (the whole text); '': math_equal where rl.rewards
  # uses it, else exact_answer.
  c.eval_verifier = ''
  c.eval_temperature = 1.0
  c.sample_every = 0  # steps between sample logs to samples.jsonl (0: off)
  c.samples_per_log = 4  # prompts per sample log, with all completions
  c.checkpoint = common.checkpointing(every=10 if local else 50)
  c.export = ''  # a directory: the final model and tokenizer, HF layout
  c.runtime = common.runtime(host_device_count=8 if local else 0)
  c.meshes = common.meshes(
      'disaggregated',
      actor=('fsdp=4', '0:4') if local else ('fsdp=-1', '0%:50%'),
      reference=('fsdp=4', 'actor') if local else ('fsdp=-1', 'actor'),
      rollout=('fsdp=1,tp=4', '4:8') if local else ('data=-1,tp=4',
                                                       '50%:100%'))
  c.sharding = common.sharding()
  return c
