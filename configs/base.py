"""The config schema: every key any launch script reads, with its meaning, and the values
of the embedded default (a tiny model on CPU, synthetic tasks, in process). `tiny_cpu.py`
and the 7B configs derive from it; a key not set here does not exist (configs are locked).
Lists are tuples: --config.train.length_buckets="(512, 1024)".
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.algorithm = "grpo"  # "grpo" (train.trainer) or "sft" (train.sft: the `sft` section)

    c.model = ml_collections.ConfigDict()
    c.model.preset = "tiny"  # a ModelConfig preset, used when hf_dir is empty
    c.model.hf_dir = ""  # a Hugging Face Qwen2.5-VL directory (config + weights)
    c.model.tokenizer = "tiny"  # "tiny" (the packaged tokenizer) or a tokenizer directory
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.attention = "blockwise"  # training/prefill and vision-tower attention: "blockwise" (pure
    # JAX, O(T x block) memory; CPU), "cudnn" (GPU), "splash" (TPU),
    # "dense" (the reference; materialises [T, T] scores)
    c.model.attention_block_q = 128  # query/key block sizes of blockwise and splash (multiples of 128
    c.model.attention_block_kv = 128  # for splash; 128 is the fastest blockwise size on CPU)
    c.model.remat = "none"  # train step's decoder layer scan: "none", "full" (keep each layer's
    # input only), "save_dots" (keep weight-matmul outputs), "save_all_dots"

    c.data = ml_collections.ConfigDict()
    c.data.train_files = ()  # JSON/JSONL task files; empty: synthetic tasks
    c.data.skip_bad_rows = False  # skip malformed rows (counted and reported) instead of failing
    c.data.extra_fields = ()  # row fields to accept and ignore (any other unknown field is an error)
    c.data.synthetic_per_kind = 8  # synthetic tasks per kind (visual search, counting, video)
    c.data.synthetic_seed = 0
    c.data.synthetic_kinds = ("visual_search", "counting", "video")
    c.data.val_files = ()  # task files validated during training (eval.every_steps); empty: none

    c.episode = ml_collections.ConfigDict()
    c.episode.max_tool_calls = 4
    c.episode.max_images = 32
    c.episode.max_new_tokens_per_turn = 32
    c.episode.max_total_tokens = 1024
    c.episode.on_error = "terminate"
    c.episode.broken_end_reasons = ("SANDBOX_FAILURE",)
    c.episode.image_min_pixels = 3136
    c.episode.image_max_pixels = 56 * 56 * 4
    c.episode.max_concurrent = 8
    # Recipe switches (docs/recipe.md has each one's released value and why ours differs).
    c.episode.max_response_tokens = 0  # > 0: also cap everything after the prompt (released 20480)
    c.episode.action_syntax = "tagged"  # "tagged" (code needs <code>) or "released" (any ```python block)
    c.episode.turn_boundary = "im_end"  # after </code>: "im_end" (<|im_end|>\n) or "newline" (released)
    c.episode.image_cap_rule = "exceed"  # end when images would "exceed" max_images, or "reach" it (released)
    c.episode.stdout_strip = "right"  # printed text trimmed "right" or on "both" sides (released)
    c.episode.observation_format = "full"  # tool response: "full" (Text and Image Result sections always) or
    # "released" (the released tool: Image Result only when shown, docs/recipe.md row 18)
    c.episode.image_prompt_file = ""  # first-prompt template ("": configs/prompts/image.txt)
    c.episode.video_prompt_file = ""  # ("": configs/prompts/video.txt); placeholders: docs/recipe.md

    c.sandbox = ml_collections.ConfigDict()
    c.sandbox.pool_size = 2
    c.sandbox.timeout_s = 10.0
    c.sandbox.allow_unisolated = False
    c.sandbox.fork_runtimes = True  # runtimes forked from one template per pool (False: a fresh bubblewrap each)
    c.sandbox.setup_file = ""  # trusted Python run in every episode's sandbox before the model's code: helper
    # functions the prompt names ("": none)
    c.sandbox.memory_limit_mb = 4096  # memory of one sandbox, all its processes together (a memory cgroup);
    # where the host has no usable cgroup, of each process (RLIMIT_AS)

    c.rollout = ml_collections.ConfigDict()
    c.rollout.engine = "jax"  # "jax" (in process), "vllm" (rollout worker and eval; needs
    # the fleet environment .venv-vllm, scripts/install_fleet.sh) or "scripted"
    # (rollout worker dry runs: turns from rollout.script_file)
    c.rollout.max_batch = 8  # sequences an engine batches (JAX slots; vLLM's max_num_seqs)
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.queue = "local"  # "local" or "redis"
    c.rollout.redis_url = "redis://127.0.0.1:6379/0"  # redis://USER@HOST:PORT/DB; rediss:// for TLS; never a password
    c.rollout.redis_password_env = ""  # the Redis user's password: the name of an environment variable holding it,
    c.rollout.redis_password_file = ""  # or a file whose first line it is (docs/fleet.md "Credentials")
    c.rollout.redis_ca_file = ""  # rediss://: the CA certificate that signed the server's ("": the system's)
    c.rollout.max_backlog = 64
    c.rollout.max_staleness = 0  # async/external: admit groups at most this many versions older than
    # the newest weights delivered to the generators (announced complete
    # export, or loaded by the rollout thread); async needs >= 1
    c.rollout.mode = "sync"  # "sync" (generate then train, on-policy as in the paper),
    # "async" (in-process worker thread runs ahead) or
    # "external" (a fleet fills the queue; weights exported)
    c.rollout.length_buckets = (256, 512, 1024)  # JAX engine prompt/cache length buckets
    c.rollout.batch_sizes = ()  # JAX engine: the row counts prefill, extension and decode dispatches pad to,
    # capped at rollout.max_batch, which is always one ((): 1, 2, 4, ... max_batch); fewer compile fewer executables
    c.rollout.decode_chunk = 8  # JAX engine: decode steps per dispatch (one compiled loop that stops once
    # every row has ended; 1: one step per dispatch)
    c.rollout.kv_continuation = True  # JAX engine: a finished request's slot keeps its KV for the episode's next
    # turn, which prefills only its new tokens (False: every turn in full)
    c.rollout.live_span = True  # JAX engine: a decode dispatch attends to the smallest cache length bucket
    # holding its rows' contexts (False: to the whole cache)
    c.rollout.warm_up = False  # JAX engine: compile every prefill/extension/decode shape when built (images sized
    # for one episode.image_max_pixels image per row), so no generate call compiles after it
    c.rollout.wait_timeout_s = 1800.0  # give up when no group arrives for this long
    c.rollout.publish_every = 1  # external mode: export weights every N steps
    c.rollout.weights_dir = ""  # external mode: shared weights directory (default WORKDIR/weights)
    c.rollout.publish_dtype = "bfloat16"  # external mode: dtype of the published weights (engines cast);
    # trainable groups each version, the frozen vision tower once
    c.rollout.queue_namespace = "pyvision"  # Redis key prefix (trainer and workers must agree)
    c.rollout.dedup_ttl_s = 7 * 24 * 3600  # external mode: keys of trained groups expire this long after the last
    c.rollout.script_file = ""  # engine "scripted": JSON {task id or "*": [turn texts]}
    c.rollout.max_epochs = 0  # rollout worker: passes over its task shard (0: until stopped)
    c.rollout.poll_s = 0.5  # rollout worker: seconds between queue/backlog polls
    c.rollout.vllm_kv_cache_mb = 256  # engine "vllm": KV cache size (0: vLLM's own sizing, GPUs)
    c.rollout.vllm_enforce_eager = True  # engine "vllm": no CUDA graphs / torch.compile
    c.rollout.vllm_gpu_memory_utilization = 0.9  # engine "vllm", vllm_kv_cache_mb 0: GPU share vLLM takes
    c.rollout.worker_stream = True  # rollout worker: episodes of many groups in flight (episode.max_concurrent),
    # each group put as it ends; False: one group at a time (blocking)

    c.rl = ml_collections.ConfigDict()
    c.rl.batch_groups = 2  # B: groups trained on per step
    c.rl.oversample = 2.0  # alpha: draw alpha * B prompts per round
    c.rl.group_size = 4  # G: rollouts per prompt
    c.rl.tool_reward_coef = 0.1
    c.rl.selection_mode = "group"  # "group" or "trajectory" (official behaviour)
    c.rl.batch_unit = "groups"  # group mode: "groups" (B groups of G rows; a rollout that does not train is a
    # masked row) or "rollouts" (released: B*G rows of trainable rollouts, whole
    # groups in rank order); the rollout filters act before ranking either way
    c.rl.rank_by = "std"  # informative groups ranked by reward std, or "arrival" (ablation)
    c.rl.drop_groups_with_broken = False
    c.rl.min_members = 2
    c.rl.normalize_std = False
    c.rl.negative_weight = 1.0  # factor on negative advantages (1: the recipe; < 1 damps the push off
    # failed rollouts that raises a peaked policy's entropy)
    c.rl.stats_include_broken = False  # True (released): std, mean and min_members over broken rollouts too
    c.rl.train_end_reasons = ()  # after advantages, train only these end reasons (empty: all)
    c.rl.require_code_image = False  # after advantages, drop rollouts that showed no code-made image
    c.rl.max_gen_rounds = 2
    c.rl.eps_low = 0.2
    c.rl.eps_high = 0.2
    c.rl.dual_clip = 3.0
    c.rl.loss_agg = "token-mean"  # or "token-mean-per-micro-batch" (released), "seq-mean-token-mean", ...
    c.rl.loss_micro_batch = 0  # token-mean-per-micro-batch: trajectories per micro-batch whose token mean is
    # one term (released: 4 per device); 0: the train step's micro-batch
    c.rl.kl_coef = 0.0  # > 0: a per-token KL term to the run's starting model (model.hf_dir),
    # reloaded on resume; the recipe has none
    c.rl.kl_estimator = "k3"  # "k1", "k2" or "k3" (rl.losses.PPOLossConfig.kl_estimator)
    c.rl.entropy_coef = 0.0  # the loss subtracts coef x token entropy: > 0 an entropy bonus, < 0
    # entropy minimisation (sharpens the policy towards its mode)
    c.rl.reward_control = ""  # a control, not the recipe: "random" (each rollout's reward a seeded
    # Bernoulli(0.5) draw, advantages carry no information) or "entropy_min"
    # (advantages 0: only the entropy term trains; needs rl.entropy_coef < 0)
    c.rl.min_entropy = 0.0  # > 0: policy gradient only on tokens of at least this entropy (nats),
    # the forking tokens; 0: every generated token (the recipe)
    c.rl.importance_sampling = "none"  # off-policy correction of stale groups (decoupled PPO): "token" or
    # "sequence" weights exp(proximal - behaviour logprobs), truncated
    # at rl.is_truncation; needs train.old_logprobs="current"
    c.rl.is_truncation = 2.0  # cap of the importance weight

    c.grading = ml_collections.ConfigDict()
    c.grading.routes = (("*", "answer_type"),)  # (data_source glob, scorer), first match wins; scorers:
    # answer_type, numeric (MRA), multiple_choice, math, judge
    c.grading.answer_gate = "last"  # "last" answer block, or "first_exact" <answer>\n\boxed{}\n</answer> (released)
    c.grading.mra_thresholds = "exact"  # "exact" or "float" (released: 10 vs 7 scores 0.5)
    c.grading.judge_url = ""  # OpenAI-compatible server root (`vllm serve`), needed by judge routes
    c.grading.judge_model = "judge"  # the served model name
    c.grading.judge_api_key_env = ""  # the judge's API key (a gateway's bearer token): an environment variable
    c.grading.judge_api_key_file = ""  # naming it, or a file whose first line it is ("" both: no key sent)
    c.grading.judge_prompt_file = ""  # judge prompt template ("": configs/prompts/judge.txt)
    c.grading.judge_timeout_s = 60.0
    c.grading.judge_max_retries = 3
    c.grading.judge_max_concurrency = 32
    c.grading.judge_max_tokens = 8
    c.grading.judge_temperature = 0.0  # judge sampling temperature (released 0.3)
    c.grading.judge_system_prompt = ""  # a system message before the judge prompt ("": none)
    c.grading.judge_verdict_pattern = ""  # regex whose group 1 is the verdict word ("": the reply's first word
    # after an optional "Judgement:" label); released: the digit after "Judgement:"
    c.grading.judge_prompt_files = ()  # (data_source glob, template file) pairs, first match wins: the few-shot
    # prompt per task family; no match: grading.judge_prompt_file

    c.train = ml_collections.ConfigDict()
    c.train.steps = 4
    c.train.lr = 1e-6
    c.train.weight_decay = 0.01
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.eps = 1e-8  # Adam's epsilon; far above the typical gradient entry it makes small,
    # noisy entries move less than the sign-like step Adam gives every entry
    c.train.grad_clip = 1.0
    c.train.lr_multipliers = ()  # "REGEX=FACTOR" strings: updates of the parameters whose path
    # ("model/norm/scale") matches are scaled by FACTOR; none in the recipe
    c.train.uniform_updates = ()  # regexes: each matching parameter moves all its entries by one shared
    # amount (its gradient's mean); none in the recipe
    c.train.freeze_vision = True
    c.train.micro_batch = 4
    c.train.length_buckets = (512, 1024)
    c.train.pack = True  # several trajectories per row (segment ids), rows of the smallest
    # length bucket holding the longest; False: one trajectory per row
    c.train.images_per_row = 0  # GRPO micro-batches' vision sizes start with room for this many
    # episode.image_max_pixels images per row (0: those of the first batch); a batch that needs
    # more raises them and compiles the train step again
    c.train.mesh_data = 1
    c.train.mesh_fsdp = 1
    c.train.mesh_tensor = 1
    c.train.schedule = "constant"  # "constant", "cosine" or "linear" (decay to 0 at train.steps)
    c.train.warmup_steps = 0
    c.train.logprob_chunk = 128  # positions per lm_head/log-softmax chunk in the train step
    c.train.old_logprobs = "current"  # PPO ratio against the proximal policy: the current params before the
    # update ("current", decoupled PPO) or the engine's ("behaviour")
    c.train.ppo_epochs = 1  # optimizer updates per batch of rollouts (classic PPO epochs; > 1 needs
    # old_logprobs="behaviour", the fixed denominator the ratio is clipped against)
    c.train.ppo_mini_batch_groups = 0  # groups per optimizer update (released ppo_mini_batch_size 16): the step makes
    # rl.batch_groups / this updates on disjoint mini-batches, all clipped against
    # the policy before the step; 0: one update on the whole batch
    c.train.xla_backend_optimization_level = -1  # XLA's LLVM optimization level for every executable of
    # the run (XLA_FLAGS, set before JAX starts; one there wins); -1: XLA's default
    c.train.checkpoint_every = 2
    c.train.keep_checkpoints = 2
    c.train.sample_groups_per_step = 1  # trajectory groups appended to workdir/trajectories.jsonl per step
    c.train.distributed = False  # multi-host: jax.distributed.initialize before any other JAX call
    c.train.coordinator_address = ""  # "host:port" of process 0 ("": autodetect: TPU pods, SLURM, ...)
    c.train.num_processes = 0  # processes of the run (0: autodetect)
    c.train.process_id = -1  # this process's index (-1: autodetect); process 0 reads the
    # rollouts and writes TensorBoard, samples and weights

    c.sft = ml_collections.ConfigDict()  # algorithm "sft"; optimizer, steps, mesh, buckets: `train`
    c.sft.train_files = ()  # released-schema SFT files (conversations, images,
    # source_dataset); empty: synthetic trajectories of scripted
    # solutions, made under WORKDIR/sft_data on first use
    c.sft.synthetic_per_kind = 32  # synthetic SFT tasks per kind of data.synthetic_kinds
    c.sft.synthetic_seed = 1000  # never the seed of RL tasks or of evaluation tasks
    c.sft.rollouts_per_task = 2  # scripted trajectories drawn per task
    c.sft.guess_share = 0.1  # share of plans that guess without a tool call
    c.sft.wrong_share = 0.1  # share of plans whose code measures wrong (thresholds, flips)
    c.sft.careful_share = 0.25  # shapes tasks: share of the careful plan (look, then measure); the rest quick
    c.sft.wording_by_options = False  # shapes tasks: a plan's first thought worded by what the options differ in
    c.sft.batch_size = 8  # samples per step
    c.sft.export_dir = ""  # HF safetensors export at the end ("": WORKDIR/hf)
    c.sft.export_dtype = ""  # cast on export ("": the params' dtype)

    c.eval = ml_collections.ConfigDict()
    c.eval.k = 4
    c.eval.max_tool_calls = 30
    c.eval.temperature = 1.0
    c.eval.top_p = 1.0
    c.eval.top_k = 0
    c.eval.seed = 0  # SamplingParams.seed of every evaluation request
    c.eval.max_new_tokens_per_turn = 32
    c.eval.max_total_tokens = 1024
    c.eval.tasks_per_batch = 0  # tasks run together (0: enough to fill episode.max_concurrent)
    c.eval.report_rollouts_per_task = 4  # trajectories per task in report.html (0: all; pyvision-eval --report-all)
    c.eval.heldout_per_kind = 0  # launch/train.py: held-out accuracy before and after training (0: off)
    c.eval.heldout_seed = 4242  # synthetic seed of the held-out tasks (never a training seed)
    c.eval.heldout_k = 2  # rollouts per held-out task
    # Validation during GRPO training on data.val_files (WORKDIR/validation/step_N, TensorBoard
    # WORKDIR/tb/validation), in the trainer's process on its current params (a JAX sampler):
    c.eval.every_steps = 0  # validate every N steps and at the last one (0: not during training)
    c.eval.before_training = False  # also validate the starting params (step 0)
    c.eval.val_k = 1  # rollouts per validation task (released: verl's val_kwargs n = 1)
    c.eval.val_temperature = 0.0  # 0: greedy (released: verl's val_kwargs temperature 0)
    c.eval.val_max_tool_calls = 0  # the validation's turn budget (0: eval.max_tool_calls)
    c.eval.val_max_batch = 0  # the validation sampler's slots (0: rollout.max_batch)
    return c
