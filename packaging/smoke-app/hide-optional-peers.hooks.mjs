let hidden = new Set();

export function initialize(data) {
  hidden = new Set(data.hidden);
}

export async function resolve(specifier, context, next) {
  const name = specifier.split('/').slice(0, specifier.startsWith('@') ? 2 : 1).join('/');
  if (hidden.has(name)) {
    const error = new Error(`Cannot find package '${name}' imported from ${context.parentURL} (hidden: not installed)`);
    error.code = 'ERR_MODULE_NOT_FOUND';
    throw error;
  }
  return next(specifier, context);
}
